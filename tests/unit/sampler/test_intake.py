"""The per-peer intake a batch carries: counts since the previous batch, bounded in peers."""

from __future__ import annotations

import pytest

from sapo.sampler.intake import OTHER, IntakeTally

pytestmark = pytest.mark.unit


def test_counts_per_peer_since_the_last_take() -> None:
    tally = IntakeTally()
    tally.received("node-b", None)
    tally.received("node-b", "no_signal")
    tally.received("node-c", "too_old")
    tally.rejected("node-b", "unused")
    tally.used(["node-b"])

    taken = {i.node_id: i for i in tally.take()}

    assert set(taken) == {"node-b", "node-c"}
    b, c = taken["node-b"], taken["node-c"]
    assert (b.received, b.used, dict(b.rejected)) == (2, 1, {"no_signal": 1, "unused": 1})
    assert (c.received, c.used, dict(c.rejected)) == (1, 0, {"too_old": 1})
    assert tally.take() == []  # a fresh start after each batch


def test_peers_beyond_the_limit_are_added_up_under_other() -> None:
    tally = IntakeTally(max_peers=2)
    for peer in ("node-b", "node-c", "node-d", "node-e"):
        tally.received(peer, None)
    tally.used(["node-e", "node-b"])

    taken = tally.take()

    assert [i.node_id for i in taken] == ["node-b", "node-c", OTHER]
    assert (taken[-1].received, taken[-1].used) == (2, 1)


def test_limit_must_allow_a_peer() -> None:
    with pytest.raises(ValueError, match="max_peers"):
        IntakeTally(max_peers=0)
