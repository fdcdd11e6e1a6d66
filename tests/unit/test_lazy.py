"""Packages whose names load on first use (`sapo.lazy`): every name their `if TYPE_CHECKING:` block imports
is exported, resolves to the value itself (never a submodule of the same name), is listed by `dir` and
bound by `import *`; an unknown one is an AttributeError, and a name that does not resolve is caught."""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapo.lazy import exports

pytestmark = pytest.mark.unit


def unresolved(package: types.ModuleType) -> list[str]:
    """The names `package` exports that are missing from their module, or a module, or not that value."""
    assert package.__file__ is not None
    table = exports(package.__name__, Path(package.__file__).read_text())
    assert package.__all__ == sorted(table)
    wrong = []
    for name, module in table.items():
        try:
            value, source = getattr(package, name), getattr(importlib.import_module(module), name)
        except AttributeError:
            wrong.append(name)
            continue
        if isinstance(value, types.ModuleType) or value is not source:
            wrong.append(name)
    return wrong


@pytest.mark.parametrize("package", ["sapo.generator", "sapo.models", "sapo.trainer"])
def test_every_exported_name_loads_on_first_use(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__
    assert unresolved(module) == []
    assert set(module.__all__) | {"__doc__", "lazy_exports"} <= set(dir(module))
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert all(namespace[name] is getattr(module, name) for name in module.__all__)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'missing'"):
        _ = module.missing


PACKAGE = """
from typing import TYPE_CHECKING

from sapo.lazy import lazy_exports

if TYPE_CHECKING:
    from lazyprobe.heavy import value as value
    from .heavy import {typo} as {typo}
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__)
"""


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "lazyprobe").mkdir()
    (tmp_path / "lazyprobe" / "heavy.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "lazyprobe"
    for name in ("lazyprobe", "lazyprobe.heavy"):
        sys.modules.pop(name, None)


def test_a_name_is_imported_on_first_use_and_one_that_does_not_resolve_is_caught(probe: Path) -> None:
    (probe / "__init__.py").write_text(PACKAGE.format(typo="valeu"))
    package = importlib.import_module("lazyprobe")
    assert "lazyprobe.heavy" not in sys.modules
    assert package.__all__ == ["valeu", "value"]
    assert package.value == 1
    assert "lazyprobe.heavy" in sys.modules
    with pytest.raises(AttributeError, match="valeu"):
        _ = package.valeu
    assert unresolved(package) == ["valeu"]


def test_a_zipped_package_loads_its_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "probe.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("lazyprobe/__init__.py", PACKAGE.format(typo="value"))
        zipped.writestr("lazyprobe/heavy.py", "value = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    try:
        assert importlib.import_module("lazyprobe").value == 1
    finally:
        for name in ("lazyprobe", "lazyprobe.heavy"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "block",
    [
        "    from lazyprobe.heavy import value\n",  # no `as`: mypy would not see it re-exported
        "    from lazyprobe.heavy import value as other\n",
        "    from . import heavy as heavy\n",  # a submodule, which the package's own import machinery sets
        "    import lazyprobe.heavy\n",
        "    x: int\n",
    ],
)
def test_a_type_checking_block_holds_only_re_exports(block: str) -> None:
    source = f"from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n{block}"
    with pytest.raises(ValueError, match="lazyprobe"):
        exports("lazyprobe", source)
