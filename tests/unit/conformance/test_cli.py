"""`sapo conformance` arguments: a bad value names the flag that gave it."""

from __future__ import annotations

import pytest

from sapo.cli import main

pytestmark = pytest.mark.unit
KIT = ["conformance", "sampler", "--node", "node-0", "--bootstrap", "127.0.0.1:1"]


def test_a_value_out_of_bounds_names_the_flag_and_the_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert main([*KIT, "--timeout", "5000", "--quiet", "601"]) == 2
    assert "--timeout: Input should be less than or equal to 3600 (got 5000.0)" in caplog.text
    assert "--quiet: Input should be less than or equal to 600 (got 601.0)" in caplog.text
    assert "SAPO_CONFORMANCE_TIMEOUT_S" not in caplog.text
    caplog.clear()
    monkeypatch.setenv("SAPO_CONFORMANCE_TIMEOUT_S", "5000")  # what the environment gave, it names
    assert main(KIT) == 2
    assert "SAPO_CONFORMANCE_TIMEOUT_S: Input should be less than or equal to 3600" in caplog.text
