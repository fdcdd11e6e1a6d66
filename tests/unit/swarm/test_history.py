"""The run record: a round row is the unfiltered mean of every scored completion of the round."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo.swarm.history import append_row, own_round_rewards, read_rows, round_row
from sapo.v1 import rollout_pb2
from tests.factories import make_group


def test_round_row_averages_every_scored_completion() -> None:
    flat = make_group(rewards=(0.0, 0.0, 0.0, 0.0))
    mixed = make_group(rewards=(1.0, 0.0, 1.0, 1.0))
    failed = make_group(rewards=(1.0, 1.0))
    failed.completions.add(finish_reason=rollout_pb2.FINISH_REASON_ERROR)  # no reward: not counted
    for group in (flat, mixed, failed):
        group.round, group.policy_version = 4, 4
    row = round_row([flat, mixed, failed])
    assert row["node"] == "node-a"
    assert (row["round"], row["policy_version"], row["groups"], row["completions"]) == (4, 4, 3, 10)
    assert row["reward_mean"] == pytest.approx(5 / 10)
    assert row["groups_with_signal"] == 1
    latest = max(g.completed_at.seconds + g.completed_at.nanos / 1e9 for g in (flat, mixed, failed))
    assert row["completed_at"] == latest  # when the round's last group was done: a wall-clock time


def test_round_row_needs_groups() -> None:
    with pytest.raises(ValueError, match="at least one group"):
        round_row([])


def test_rows_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "rounds" / "node-a.jsonl"
    assert read_rows(path) == []
    append_row(path, {"round": 0, "reward_mean": 0.25})
    append_row(path, {"round": 1, "reward_mean": 0.5})
    assert [r["round"] for r in read_rows(path)] == [0, 1]


def test_own_round_rewards_are_the_run_s_rounds_in_round_order() -> None:
    """An async node's rows close out of round order and run past the run's rounds, the last partial."""
    rows = [{"round": r, "reward_mean": r / 10} for r in (1, 0, 2, 4, 3)]
    assert own_round_rewards(rows, 3) == [0.0, 0.1, 0.2]
    assert own_round_rewards(rows, 9) == [0.0, 0.1, 0.2, 0.3, 0.4]
