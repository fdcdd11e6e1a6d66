"""I/J plans, the per-source quota, uniform and reward-guided choice, the pool and the dedupe set."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapo.sampler import Entry, Mix, MixPolicy, Pool, SeenGroups, SelectionPolicy, pick_external, plan
from sapo.sampler.selection import shuffled, usable_external
from tests.unit.sampler.builders import scored

pytestmark = pytest.mark.unit

ADAPTIVE = Mix(4, 4, MixPolicy.ADAPTIVE, min_external=2, max_external=6)


def _entries(peers: list[str], rewards: tuple[float, ...] = (1.0, 0.0)) -> list[Entry[int]]:
    return [Entry(scored("external", p, rewards=rewards), i, 0.0) for i, p in enumerate(peers)]


def test_fixed_plan_ignores_availability() -> None:
    assert plan(Mix(4, 4), 0, 100) == (4, 4)


@pytest.mark.parametrize(
    ("local", "external", "expected"),
    [
        (8, 8, (4, 4)),  # both plentiful: the configured mix
        (1, 8, (2, 6)),  # local short of signal: slots go to the swarm, up to max_external
        (3, 8, (3, 5)),
        (8, 3, (5, 3)),  # external pool thin: slots go back to local
        (8, 0, (6, 2)),  # ... but never below min_external
        (0, 0, (6, 2)),  # both short: the pool's shortage decides, the lower bound holds
    ],
)
def test_adaptive_plan_keeps_the_total_and_the_bounds(
    local: int, external: int, expected: tuple[int, int]
) -> None:
    i, j = plan(ADAPTIVE, local, external)
    assert (i, j) == expected
    assert i + j == 8


def test_usable_external_counts_under_the_quota_up_to_a_cap() -> None:
    assert usable_external([5, 1, 3], quota=2, cap=100) == 5
    assert usable_external([5, 5, 5, 5], quota=2, cap=4) == 4


@pytest.mark.parametrize("policy", list(SelectionPolicy))
def test_pick_external_respects_the_quota_and_is_reproducible(policy: SelectionPolicy) -> None:
    entries = _entries(["a"] * 5 + ["b"] * 5 + ["c"])
    picked = pick_external(entries, 4, 2, policy, random.Random(1))
    assert len(picked) == 4
    assert max(Counter(e.scored.peer for e in picked).values()) <= 2
    assert picked == pick_external(entries, 4, 2, policy, random.Random(1))
    # Not enough peers to fill k under the quota: fewer groups, never a broken quota.
    assert len(pick_external(entries, 10, 1, policy, random.Random(1))) == 3


def test_reward_guided_prefers_groups_that_succeeded_more() -> None:
    high = Entry(scored("external", "a", rewards=(1.0, 1.0, 1.0, 0.0)), 0, 0.0)  # weight 0.85
    low = Entry(scored("external", "b", rewards=(1.0, 0.0, 0.0, 0.0)), 1, 0.0)  # weight 0.35
    rng = random.Random(7)
    wins = Counter(
        pick_external([high, low], 1, 1, SelectionPolicy.REWARD_GUIDED, rng)[0].handle for _ in range(4000)
    )
    assert wins[0] / 4000 == pytest.approx(0.85 / 1.2, abs=0.03)
    uniform = Counter(
        pick_external([high, low], 1, 1, SelectionPolicy.UNIFORM, rng)[0].handle for _ in range(4000)
    )
    assert uniform[0] / 4000 == pytest.approx(0.5, abs=0.03)


def test_pool_is_bounded_per_origin_and_counts_peers() -> None:
    pool: Pool[int] = Pool(max_per_origin=2)
    first, second, third = _entries(["a", "a", "b"])
    assert pool.add(first) is None
    assert pool.add(second) is None
    assert pool.add(Entry(scored("local", "node-0"), 9, 0.0)) is None
    assert pool.add(third) is first  # the oldest external goes; local has its own bound
    assert sorted(pool.peer_counts()) == [1, 1]
    assert pool.take_where(lambda e: e.scored.peer == "b") == [third]
    assert pool.count("external") == 1
    assert pool.count("local") == 1


@pytest.mark.parametrize("n", [0, 1, 2, 7, 500])
def test_shuffled_is_random_shuffle_read_from_the_end(n: int) -> None:
    items = list(range(n))
    expected = list(items)
    random.Random(n).shuffle(expected)
    assert list(shuffled(items, random.Random(n))) == expected[::-1]
    assert items == list(range(n))  # the caller's sequence is left alone


def test_shuffled_draws_only_for_what_is_read() -> None:
    rng = random.Random(3)
    walk = shuffled(range(10_000), rng)
    first = [next(walk) for _ in range(4)]
    assert len(set(first)) == 4
    assert rng.getstate() != random.Random(3).getstate()
    untouched = random.Random(3)
    for i in range(9_999, 9_995, -1):
        untouched.randrange(i + 1)
    assert rng.getstate() == untouched.getstate()  # four draws, not one per item


def test_pool_takes_aged_entries_oldest_first_and_skips_those_gone_otherwise() -> None:
    pool: Pool[int] = Pool(max_per_origin=10_000)
    external = [
        Entry(scored("external", f"p{i % 7}", completed_s=float(i % 50)), i, 0.0) for i in range(3000)
    ]
    local = [Entry(scored("local", "node-0", policy_version=i % 5), i, 0.0) for i in range(40)]
    for entry in [*external, *local]:
        pool.add(entry)
    pool.remove(e for e in external if e.handle % 3 == 0)  # enough to make the pool rebuild its heap
    back = [e for e in external[2800:] if e.handle % 3 == 0]
    for entry in back:  # left and came back: taken once
        pool.add(entry)
    pooled = {e.handle for e in external if e.handle % 3 != 0} | {e.handle for e in back}
    want = sorted(e.handle for e in external if e.scored.completed_s < 10.0 and e.handle in pooled)

    aged = pool.take_aged("external", 10.0)

    assert sorted(e.handle for e in aged) == want
    assert [e.scored.completed_s for e in aged] == sorted(e.scored.completed_s for e in aged)
    assert pool.take_aged("external", 10.0) == []
    assert pool.count("external") == len(pooled) - len(want)
    by_age = sorted(local, key=lambda e: e.scored.group.policy_version)  # then arrival: sort is stable
    old_local = [e.handle for e in by_age if e.scored.group.policy_version < 2]
    assert [e.handle for e in pool.take_aged("local", 2)] == old_local


def test_seen_groups_forget_the_oldest_beyond_capacity() -> None:
    seen = SeenGroups(2, ["a", "b"])
    seen.add("c")
    assert "a" not in seen
    assert "b" in seen
    assert "c" in seen
    seen.discard("b")
    assert len(seen) == 1


@given(
    local=st.integers(0, 8),
    external=st.integers(0, 8),
    adaptive=st.booleans(),
    bounds=st.tuples(st.integers(0, 16), st.integers(0, 16)),
    on_hand=st.tuples(st.integers(0, 20), st.integers(0, 20)),
)
def test_min_local_bounds_every_plan(
    local: int, external: int, adaptive: bool, bounds: tuple[int, int], on_hand: tuple[int, int]
) -> None:
    policy = MixPolicy.ADAPTIVE if adaptive else MixPolicy.FIXED
    mix = Mix(local, external, policy, min_external=min(bounds), max_external=max(bounds))
    assert plan(mix, *on_hand)[0] >= mix.min_local
