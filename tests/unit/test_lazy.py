"""Packages whose names load on first use (`sapo.lazy`): every name they export is there, the value
itself (never a submodule of the same name), and an unknown one is an AttributeError."""

from __future__ import annotations

import importlib
import types

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("package", ["sapo.generator", "sapo.models", "sapo.trainer"])
def test_every_exported_name_loads_on_first_use(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert not isinstance(getattr(module, name), types.ModuleType), name
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'missing'"):
        _ = module.missing
