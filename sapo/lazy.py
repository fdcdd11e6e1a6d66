"""Names a package re-exports, imported on first use (PEP 562), so a light module of a heavy package
imports without torch: `sapo.generator.settings` runs `sapo.generator`'s `__init__` first, and a service
with bad settings should fail before seconds of torch and transformers.

A package lists the names under `if TYPE_CHECKING:` (real imports, what mypy and the import graph see)
and gives the same table to `lazy_exports` otherwise. A name must not be a submodule's name too: once the
submodule is imported, the package attribute is that module and `__getattr__` is never asked.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """The module `__getattr__` of `package`: `exports` maps each of its modules to the names it
    re-exports. A name's module is imported on first use and the value kept in the package."""
    home = {name: module for module, names in exports.items() for name in names}
    namespace = sys.modules[package].__dict__

    def attribute(name: str) -> object:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return attribute
