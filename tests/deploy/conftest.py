"""Fixtures of the chart tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.helm import CI_VALUES


@pytest.fixture(params=CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))
def scenario(request: pytest.FixtureRequest) -> Path:
    """Each ci/ values file in turn: minimal, full-monitoring-strimzi, gpu-generator, external-sasl-kafka."""
    path: Path = request.param
    return path
