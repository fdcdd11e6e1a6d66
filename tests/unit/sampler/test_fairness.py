"""Fair pool admission per verified identity: the pure rule, and its guarantees through the real pool
under any interleaving of honest peers and floods (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo.sampler import Entry, Pool
from sapo.sampler.fairness import Admission, admission
from tests.unit.sampler.builders import scored

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("own", "largest", "total", "expected"),
    [
        (0, 0, 0, Admission.ROOM),
        (3, 3, 7, Admission.ROOM),  # room: everyone is welcome
        (3, 3, 8, Admission.REPLACE_OWN),  # the largest holder only displaces itself
        (0, 2, 8, Admission.REPLACE_LARGEST),  # a newcomer takes a place of the largest holder
        (1, 3, 8, Admission.REPLACE_LARGEST),
        (1, 2, 8, Admission.REFUSE),  # it would then hold as many as the largest: no improvement
        (0, 1, 8, Admission.REFUSE),  # equal shares: first come, first served
    ],
)
def test_admission_rule(own: int, largest: int, total: int, expected: Admission) -> None:
    assert admission(own, largest, total, capacity=8) is expected


def _offer(pool: Pool[int], peer: str, handle: int) -> tuple[bool, str | None]:
    """Offer a group of `peer` as the assembler does: (pooled, the peer of the evicted group)."""
    if pool.admission("external", peer) is Admission.REFUSE:
        return False, None
    evicted = pool.add(Entry(scored("external", peer), handle, 0.0))
    return True, evicted.scored.peer if evicted is not None else None


@settings(max_examples=200, deadline=None)
@given(
    honest=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=5),
    flood_at=st.lists(st.integers(min_value=0, max_value=15), max_size=200),
)
def test_a_flood_never_displaces_or_shuts_out_peers_within_their_share(
    honest: list[int], flood_at: list[int]
) -> None:
    """Honest peer i sends honest[i] <= k groups; a flooder sends any number at any moment. With room
    for every peer's share (capacity >= (peers + 1) x k), every honest group is pooled and stays."""
    k = max(honest)
    pool: Pool[int] = Pool(max_per_origin=(len(honest) + 1) * k)
    sends = [f"peer-{i}" for i, n in enumerate(honest) for _ in range(n)]
    flood = iter(sorted(flood_at))
    next_flood = next(flood, None)
    handle = 0
    for position, peer in enumerate(sends):
        while next_flood is not None and next_flood <= position:
            handle += 1
            _, evicted = _offer(pool, "flood", handle)
            assert evicted in (None, "flood")  # a flood only ever displaces itself
            next_flood = next(flood, None)
        handle += 1
        assert _offer(pool, peer, handle)[0]
    for _ in flood_at[len(sends) :]:  # and a flood after them all changes nothing
        handle += 1
        _offer(pool, "flood", handle)
    held = {p: 0 for p in sends}
    for entry in pool.entries("external"):
        if entry.scored.peer != "flood":
            held[entry.scored.peer] += 1
    assert held == {f"peer-{i}": n for i, n in enumerate(honest)}


@settings(max_examples=200, deadline=None)
@given(peers=st.lists(st.sampled_from([f"p{i}" for i in range(12)]), max_size=300))
def test_no_peer_is_evicted_for_one_that_would_hold_as_many(peers: list[str]) -> None:
    """Under any arrival order (many identities included): an eviction always moves a place from the
    largest holder to a peer left holding fewer, and the pool never exceeds its bound."""
    capacity = 10
    pool: Pool[int] = Pool(max_per_origin=capacity)
    for handle, peer in enumerate(peers):
        before = dict.fromkeys(peers, 0)
        for entry in pool.entries("external"):
            before[entry.scored.peer] += 1
        pooled, evicted = _offer(pool, peer, handle)
        if evicted is not None and evicted != peer:
            assert before[evicted] == max(before.values())
            assert before[peer] + 1 < before[evicted]
        if not pooled:
            assert pool.count("external") == capacity
        assert pool.count("external") <= capacity
        assert sorted(pool.peer_counts()) == sorted(
            n for n in _counts(pool).values() if n
        )  # the pool's share bookkeeping matches its entries


def _counts(pool: Pool[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in pool.entries("external"):
        counts[entry.scored.peer] = counts.get(entry.scored.peer, 0) + 1
    return counts


def test_the_largest_holder_is_tracked_as_groups_leave() -> None:
    pool: Pool[int] = Pool(max_per_origin=4)
    entries = [Entry(scored("external", p), i, 0.0) for i, p in enumerate(["a", "a", "a", "b"])]
    for entry in entries:
        pool.add(entry)
    pool.remove(entries[:2])  # a: 1, b: 1
    pool.add(Entry(scored("external", "c"), 9, 0.0))
    pool.add(Entry(scored("external", "c"), 10, 0.0))  # full: a 1, b 1, c 2
    assert pool.admission("external", "d") is Admission.REPLACE_LARGEST
    evicted = pool.add(Entry(scored("external", "d"), 11, 0.0))
    assert evicted is not None and evicted.handle == 9  # c's oldest
    assert pool.admission("external", "e") is Admission.REFUSE  # everyone holds 1 now
