"""Work items and pacing: which rounds may start, which versions may generate them, stable ids."""

from __future__ import annotations

import pytest

from sapo.generator import Item, Pacing, PacingMode, group_id, item_seed, plan_rounds, round_items
from sapo.generator.work import PacingSettings

pytestmark = pytest.mark.unit
LOCKSTEP = Pacing(PacingMode.LOCKSTEP, 0, 0)
ASYNC = Pacing(PacingMode.ASYNC, 2, 0)


def test_lockstep_round_r_needs_exactly_version_r() -> None:
    [item] = round_items("n", 3, 1, LOCKSTEP)
    assert [item.fate(v) for v in (2, 3, 4)] == ["wait", "ready", "obsolete"]


def test_async_rounds_run_at_most_max_ahead_versions_ahead() -> None:
    [item] = round_items("n", 5, 1, ASYNC)
    assert [item.fate(v) for v in (2, 3, 9)] == ["wait", "ready", "ready"]


def test_rounds_planned_per_version_from_where_a_trainer_starts() -> None:
    assert list(plan_rounds(0, 0, LOCKSTEP)) == [0]
    assert list(plan_rounds(1, 1, LOCKSTEP)) == [1]
    assert list(plan_rounds(7, 7, LOCKSTEP)) == [
        7
    ]  # a trainer resumed at version 7: rounds below were trained
    assert list(plan_rounds(0, 0, ASYNC)) == [0, 1, 2]
    assert list(plan_rounds(1, 3, ASYNC)) == [3]
    assert list(plan_rounds(5, 5, Pacing(PacingMode.LOCKSTEP, 0, rounds=5))) == []


def test_an_async_run_keeps_a_fresh_round_ahead_of_every_version_it_still_trains() -> None:
    """One batch may use more than a round's local groups, so the batch of the last version (3 here)
    must not depend on rounds 0..2 alone: each version below 3 lets one more round start."""
    limited = Pacing(PacingMode.ASYNC, 2, rounds=3)
    assert list(plan_rounds(0, 0, limited)) == [0, 1, 2]
    assert list(plan_rounds(1, 3, limited)) == [3]
    assert list(plan_rounds(2, 4, limited)) == [4]
    assert list(plan_rounds(3, 5, limited)) == []  # version 3 is the run's last: nothing more to feed
    assert list(plan_rounds(3, 3, limited)) == []  # nor for a trainer restarted there


def test_items_are_the_rounds_questions_in_stream_order() -> None:
    items = round_items("n", 2, 3, LOCKSTEP)
    assert [(i.round, i.position, i.stream_index) for i in items] == [(2, 0, 6), (2, 1, 7), (2, 2, 8)]
    assert len({i.key for i in items}) == 3


def test_items_survive_the_wire() -> None:
    for item in (Item("n", 1, 2, 5, 1, 1), Item("n", 4, 0, 8, 2, None)):
        assert Item.from_proto(item.to_proto(epoch=3)) == item


def test_ids_and_seeds_depend_on_node_round_and_position_only() -> None:
    assert group_id("a", 1, 2) == group_id("a", 1, 2)
    ids = {group_id(n, r, p) for n in ("a", "b") for r in range(3) for p in range(3)}
    assert len(ids) == 18
    seeds = {item_seed(s, r, p) for s in range(2) for r in range(3) for p in range(3)}
    assert len(seeds) == 18 and all(0 <= s < 2**63 for s in seeds)


def test_max_ahead_belongs_to_async_pacing() -> None:
    with pytest.raises(ValueError, match="ROUND_MODE=async"):
        PacingSettings(max_ahead=2)
    assert PacingSettings(round_mode=PacingMode.ASYNC, max_ahead=2).pacing().max_ahead == 2
    assert PacingSettings().pacing() == LOCKSTEP
