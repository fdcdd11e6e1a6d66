"""Names a package re-exports, imported on first use (PEP 562), so a light module of a heavy package
imports without torch: `sapo.generator.settings` runs `sapo.generator`'s `__init__` first, and a service
with bad settings should fail before seconds of torch and transformers.

A package writes each name once, as a real import under `if TYPE_CHECKING:` in the `A as A` form (what
mypy sees, an explicit re-export; the import graph sees the edge), and ends that block with

    else:
        __getattr__, __dir__, __all__ = lazy_exports(__name__)

`lazy_exports` reads those imports from the package's source with `ast`, so each name is written in one
place. `dir(package)` lists them with the package's own attributes; `from package import *` imports them
all (and so their modules). A name must not be a submodule's name too: once the submodule is imported, the
package attribute is that module and `__getattr__` is never asked.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable


def exports(package: str, source: str) -> dict[str, str]:
    """Each name that `package`, whose `__init__` is `source`, imports under its module-level
    `if TYPE_CHECKING:`, to the module it comes from. ValueError for anything else in that block."""
    home: dict[str, str] = {}
    tree = ast.parse(source)
    blocks = [n.body for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    for statement in (node for body in blocks for node in body):
        if not isinstance(statement, ast.ImportFrom):
            raise ValueError(f"{package}: only `from module import A as A` under `if TYPE_CHECKING:`")
        module = importlib.util.resolve_name("." * statement.level + (statement.module or ""), package)
        for alias in statement.names:
            if alias.asname != alias.name or module == package:
                raise ValueError(f"{package}: write `from module import {alias.name} as {alias.name}`")
            home[alias.name] = module
    return home


def lazy_exports(package: str) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """The module `__getattr__`, `__dir__` and `__all__` of `package`: each name imported under its
    `if TYPE_CHECKING:`, whose module is imported on first use and the value kept in the package."""
    home = exports(package, _source(package))
    namespace = sys.modules[package].__dict__

    def attribute(name: str) -> object:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted(namespace.keys() | home.keys())

    return attribute, listing, sorted(home)


def _source(package: str) -> str:
    """The package's `__init__` source, from its loader (a file, or a zip archive's member)."""
    spec = sys.modules[package].__spec__
    get_source = getattr(spec.loader, "get_source", None) if spec is not None else None  # zipimport's too
    source = get_source(package) if get_source is not None else None
    if not isinstance(source, str):
        raise ImportError(f"{package}: its source is needed for its lazy exports, and its loader has none")
    return source
