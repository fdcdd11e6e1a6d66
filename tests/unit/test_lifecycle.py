"""The stop flag's bound on waits for the broker: none before a stop, `broker_wait_s` from the later
of a wait's start and the stop, nothing at all once one wait ran out."""

from __future__ import annotations

import pytest

from sapo.lifecycle import StopFlag

pytestmark = pytest.mark.unit


def test_before_a_stop_a_wait_lasts_its_own_timeout() -> None:
    assert StopFlag(5.0).deadline(100.0, 30.0) == 130.0


def test_a_stop_bounds_waits_begun_before_and_after_it() -> None:
    flag = StopFlag(5.0)
    flag.set("SIGTERM")
    stopped = flag._set_at
    assert stopped is not None
    assert flag.deadline(stopped - 20.0, 30.0) == stopped + 5.0  # a renewal under way when SIGTERM came
    assert flag.deadline(stopped + 60.0, 30.0) == stopped + 65.0  # a flush after a long last unit
    assert flag.deadline(stopped + 60.0, 2.0) == stopped + 62.0  # a shorter timeout of its own holds


def test_after_one_wait_ran_out_while_stopping_later_ones_end_at_once() -> None:
    flag = StopFlag(5.0)
    flag.broker_unanswered()  # before a stop: a slow broker, not a stop's business
    flag.set("SIGTERM")
    stopped = flag._set_at
    assert stopped is not None
    assert flag.deadline(stopped, 30.0) == stopped + 5.0
    flag.broker_unanswered()
    assert flag.deadline(stopped + 7.0, 30.0) == stopped + 7.0


def test_without_a_bound_a_stop_shortens_nothing() -> None:
    flag = StopFlag()
    flag.set()
    flag.broker_unanswered()
    assert flag.deadline(100.0, 30.0) == 130.0
