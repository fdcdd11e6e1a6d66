"""Round pacing: lockstep generates round r with version r; async stays within max_ahead versions."""

from __future__ import annotations

import pytest

from sapo.generator import Pacing, PacingMode

pytestmark = pytest.mark.unit


def test_lockstep_needs_exactly_the_round_version() -> None:
    pacing = Pacing(PacingMode.LOCKSTEP)
    assert pacing.may_generate(0, 0)
    assert not pacing.may_generate(1, 0)
    assert pacing.may_generate(3, 3)
    assert pacing.required_version(5) == 5


def test_lockstep_jumps_to_a_newer_loaded_version_and_async_never_jumps() -> None:
    assert Pacing(PacingMode.LOCKSTEP).align(2, 5) == 5
    assert Pacing(PacingMode.LOCKSTEP).align(5, 2) == 5
    assert Pacing(PacingMode.ASYNC, max_ahead=2).align(2, 5) == 2


def test_async_runs_at_most_max_ahead_versions_ahead() -> None:
    pacing = Pacing(PacingMode.ASYNC, max_ahead=2)
    assert [pacing.may_generate(r, 0) for r in range(4)] == [True, True, True, False]
    assert pacing.may_generate(3, 1)
    assert pacing.required_version(1) == 0


def test_round_limit() -> None:
    assert not Pacing(PacingMode.LOCKSTEP).finished(10**6)
    limited = Pacing(PacingMode.LOCKSTEP, rounds=3)
    assert not limited.finished(2)
    assert limited.finished(3)


def test_lockstep_rejects_max_ahead() -> None:
    with pytest.raises(ValueError, match="async"):
        Pacing(PacingMode.LOCKSTEP, max_ahead=1)
