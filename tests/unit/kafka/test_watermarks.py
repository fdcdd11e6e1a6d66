"""`Watermarks`: the committable position is the lowest unfinished offset, whatever order records
finish in, with memory bounded by what is unfinished."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo.kafka import Watermarks

pytestmark = pytest.mark.unit
TP = ("t", 0)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 400)), max_size=300))
def test_the_position_is_the_lowest_unfinished_offset(steps: list[tuple[bool, int]]) -> None:
    """Records are read in offset order (re-reads of pending offsets included) and finished in any
    order; after every step the position is what a scan of the unfinished set says, the positions
    are marked for storing exactly when it moved, and the unfinished count is right."""
    marks, next_offset, stored = Watermarks(), 0, 0
    unfinished: set[int] = set()
    for read, pick in steps:
        if read or not unfinished:
            offset = next_offset if pick % 5 or not unfinished else min(unfinished)  # a re-read
            marks.seen(TP, offset)
            unfinished.add(offset)
            next_offset = max(next_offset, offset + 1)
        else:
            offset = sorted(unfinished)[pick % len(unfinished)]
            marks.finish(TP, offset)
            unfinished.discard(offset)
        want = min(unfinished) if unfinished else next_offset
        assert marks.positions() == [("t", 0, want)]
        assert marks.take_dirty() == (want != stored)
        assert marks.pending_count() == len(unfinished)
        stored = want


def test_finished_offsets_behind_a_held_one_do_not_pile_up() -> None:
    marks = Watermarks()
    marks.seen(TP, 0)  # held for the whole run, as a group waiting in a sampler's pool
    for offset in range(1, 100_000):
        marks.seen(TP, offset)
        marks.finish(TP, offset)
        assert marks.positions() == [("t", 0, 0)]
        assert not marks.take_dirty()  # the position stayed at the held record: nothing to store
    assert len(marks._lowest[TP]) <= 2 * marks.pending_count() + 65
    marks.finish(TP, 0)
    assert marks.take_dirty()
    assert marks.positions() == [("t", 0, 100_000)]
    assert marks._lowest[TP] == []


def test_dropped_partitions_leave_the_count() -> None:
    marks = Watermarks()
    for offset in range(3):
        marks.seen(TP, offset)
        marks.seen(("t", 1), offset)
    marks.finish(TP, 1)
    marks.drop([TP])
    assert marks.pending_count() == 3
    assert marks.positions() == [("t", 1, 0)]
