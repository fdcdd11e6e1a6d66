"""Round modes on a fake clock: lock-step rounds and timeouts, deadline fill-in, async, expiry, bounds."""

from __future__ import annotations

from collections import Counter

import pytest

from sapo.sampler import Assembler, AssemblyConfig, Mix, RoundMode, SelectionPolicy, make_assembler
from sapo.sampler.assembler import LOCKSTEP_WINDOW
from tests.unit.sampler.builders import assembly_config, scored

pytestmark = pytest.mark.unit

T0 = 1000.0


def _config(mode: RoundMode, **overrides: object) -> AssemblyConfig:
    base: dict[str, object] = {
        "mode": mode,
        "mix": Mix(2, 2),
        "selection": SelectionPolicy.UNIFORM,
        "max_per_source": 1,
        "max_pool_groups": 64,
        "max_external_age_s": 600.0,
        "max_policy_lag": 4,
        "questions_per_round": 3,
        "expected_peers": 2,
        "lockstep_timeout_s": 10.0,
        "lockstep_local_timeout_s": 100.0,
        "deadline_s": 5.0,
        "async_timeout_s": 60.0,
    }
    return assembly_config(**(base | overrides))


class Feed:
    """Feeds groups the way the core does: arrival first, then the pool (signal-free groups arrive
    but are never pooled)."""

    def __init__(self, assembler: Assembler[str]) -> None:
        self.assembler = assembler
        self.count = 0

    def group(
        self, origin: str, peer: str, now: float, *, round_: int = 0, signal: bool = True, **kw: object
    ) -> str | None:
        self.count += 1
        s = scored(origin, peer, round_=round_, completed_s=now, **kw)  # type: ignore[arg-type]
        self.assembler.arrived(s.peer, s.group_id, s.round, s.origin, now)
        self.assembler.screened(s.origin)
        if not signal:
            return "no_signal"
        return self.assembler.add(s, f"{origin}-{self.count}", now)


def test_async_waits_for_i_local_and_j_external_under_the_quota() -> None:
    feed = Feed(make_assembler(_config(RoundMode.ASYNC)))
    for _ in range(3):
        feed.group("local", "node-0", T0)
    feed.group("external", "peer-1", T0)
    feed.group("external", "peer-1", T0)  # same peer: the quota of 1 lets one of these in a batch
    assert feed.assembler.next_batch(T0 + 1, 0) is None
    feed.group("external", "peer-2", T0)
    batch = feed.assembler.next_batch(T0 + 1, 0)
    assert batch is not None
    assert [e.handle for e in batch.local] == ["local-1", "local-2"]  # oldest local first
    assert sorted(e.scored.peer for e in batch.external) == ["peer-1", "peer-2"]
    assert not batch.waited_out
    assert feed.assembler.pool.count("local") == 1
    assert feed.assembler.pool.count("external") == 1
    assert feed.assembler.next_batch(T0 + 1, 1) is None


@pytest.mark.parametrize("mode", [RoundMode.ASYNC, RoundMode.DEADLINE])
def test_streaming_waits_for_no_more_external_than_the_expected_peers_give(mode: RoundMode) -> None:
    """One peer and a quota of 2 can never fill J = 4: the batch takes the 2 and local fills the rest,
    or (async) a two-node swarm's samplers wait for ever and their generators stop max_ahead ahead."""
    feed = Feed(make_assembler(_config(mode, mix=Mix(4, 4), max_per_source=2, expected_peers=1)))
    for _ in range(6):
        feed.group("local", "node-0", T0)
    feed.group("external", "peer-1", T0)
    assert feed.assembler.next_batch(T0, 0) is None  # the peer could still give one more
    for _ in range(3):
        feed.group("external", "peer-1", T0)
    batch = feed.assembler.next_batch(T0, 0)  # before any deadline
    assert batch is not None
    assert (len(batch.local), [e.scored.peer for e in batch.external]) == (6, ["peer-1", "peer-1"])
    assert not batch.waited_out  # short of J, but all the expected peer can give


def test_streaming_without_expected_peers_never_waits_for_the_swarm() -> None:
    feed = Feed(make_assembler(_config(RoundMode.ASYNC, expected_peers=0)))
    feed.group("local", "node-0", T0)
    assert feed.assembler.next_batch(T0, 0) is None  # I = 2 local are not in yet
    for _ in range(2):
        feed.group("local", "node-0", T0)
    batch = feed.assembler.next_batch(T0, 0)
    assert batch is not None
    assert (len(batch.local), batch.external) == (3, [])


def test_async_waits_for_more_expected_peers_until_its_timeout() -> None:
    """Two more peers could give 4: the batch waits for them, but not for ever (peers that stopped
    publishing, such as a bounded run's peers that finished first, cannot stall it)."""
    feed = Feed(make_assembler(_config(RoundMode.ASYNC, mix=Mix(4, 4), max_per_source=2, expected_peers=3)))
    for _ in range(6):
        feed.group("local", "node-0", T0)
    for _ in range(4):
        feed.group("external", "peer-1", T0)
    assert feed.assembler.next_batch(T0, 0) is None  # 2 usable; I local are in: the wait starts now
    assert feed.assembler.next_batch(T0 + 59.9, 0) is None
    batch = feed.assembler.next_batch(T0 + 60, 0)
    assert batch is not None
    assert (len(batch.local), [e.scored.peer for e in batch.external]) == (6, ["peer-1", "peer-1"])
    assert batch.waited_out


def test_deadline_fills_missing_external_slots_from_local() -> None:
    feed = Feed(make_assembler(_config(RoundMode.DEADLINE)))
    for _ in range(5):
        feed.group("local", "node-0", T0)
    feed.group("external", "peer-1", T0)
    assert feed.assembler.next_batch(T0, 0) is None  # I local are in: the deadline starts now
    assert feed.assembler.next_batch(T0 + 4.9, 0) is None
    batch = feed.assembler.next_batch(T0 + 5.0, 0)
    assert batch is not None
    assert (len(batch.local), len(batch.external)) == (3, 1)
    assert batch.waited_out
    # The next batch has only 2 local: its deadline starts afresh.
    assert feed.assembler.next_batch(T0 + 5.1, 1) is None
    assert feed.assembler.next_batch(T0 + 10.2, 1) is not None


def test_streaming_expires_old_external_and_stale_local_groups() -> None:
    assembler: Assembler[str] = make_assembler(_config(RoundMode.ASYNC))
    feed = Feed(assembler)
    feed.group("local", "node-0", T0, policy_version=0)
    feed.group("local", "node-0", T0, policy_version=3)
    feed.group("external", "peer-1", T0 - 700)
    assert assembler.next_batch(T0, 5) is None
    reasons = Counter((d.entry.handle, d.reason) for d in assembler.take_discards())
    assert reasons == Counter({("local-1", "expired"): 1, ("external-3", "expired"): 1})
    assert assembler.pool.count("local") == 1


def test_a_full_pool_is_shared_fairly_between_peers_and_never_takes_local_places() -> None:
    assembler: Assembler[str] = make_assembler(_config(RoundMode.ASYNC, max_pool_groups=4))
    feed = Feed(assembler)
    for _ in range(4):  # a flooding peer fills the external pool
        assert feed.group("external", "flood", T0) is None
    assert feed.group("local", "node-0", T0) is None  # the node's own have places of their own
    assert feed.group("external", "peer-1", T0) is None  # in place of the flood's oldest (external-1)
    assert feed.group("external", "peer-2", T0) is None  # again (external-2)
    assert feed.group("external", "peer-2", T0) == "pool_full"  # peer-2 would hold as many as the flood
    assert feed.group("external", "flood", T0) is None  # the flood only displaces itself (external-3)
    evicted = [(d.entry.handle, d.reason) for d in assembler.take_discards()]
    assert evicted == [("external-1", "evicted"), ("external-2", "evicted"), ("external-3", "evicted")]
    peers = Counter(e.scored.peer for e in assembler.pool.entries("external"))
    assert peers == Counter({"flood": 2, "peer-1": 1, "peer-2": 1})
    assert assembler.pool.count("local") == 1


def _lockstep(**overrides: object) -> Feed:
    return Feed(make_assembler(_config(RoundMode.LOCKSTEP, **overrides)))


def test_lockstep_closes_a_round_when_local_and_peers_are_in() -> None:
    feed = _lockstep()
    feed.group("external", "peer-1", T0, round_=0)
    feed.group("external", "peer-1", T0, round_=1)  # a later round waits in the pool
    for _ in range(2):
        feed.group("local", "node-0", T0, round_=0)
    feed.group("local", "node-0", T0, round_=0, signal=False)  # arrived: counts toward the round
    assert feed.assembler.next_batch(T0, 0) is None  # only 1 of 2 peers so far
    feed.group("external", "peer-2", T0, round_=0)
    batch = feed.assembler.next_batch(T0, 0)
    assert batch is not None
    assert batch.round == 0
    assert (len(batch.local), len(batch.external)) == (2, 2)
    assert not batch.waited_out
    assert all(e.scored.round == 0 for e in batch.entries)
    assert feed.assembler.pool.count("external") == 1  # round 1's group
    assert feed.group("local", "node-0", T0, round_=0) == "late_round"


def test_lockstep_waits_for_peers_only_until_the_timeout_and_discards_the_unused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed = _lockstep(max_per_source=1)
    for _ in range(3):
        feed.group("local", "node-0", T0 + 1, round_=0)
    feed.group("external", "peer-1", T0, round_=0)
    feed.group("external", "peer-1", T0, round_=0)
    assert feed.assembler.next_batch(T0 + 10.9, 0) is None
    batch = feed.assembler.next_batch(T0 + 11.0, 0)
    assert batch is not None
    assert (len(batch.local), len(batch.external)) == (2, 1)
    assert batch.waited_out  # one peer of the expected ones
    assert "lock-step round 0: 1 of 2 expected peers after 10 s (lockstep_timeout_s)" in caplog.text
    unused = feed.assembler.take_discards()
    assert sorted(d.entry.scored.origin for d in unused) == ["external", "local"]
    assert {d.reason for d in unused} == {"unused"}
    assert feed.assembler.pool.count("local") + feed.assembler.pool.count("external") == 0


def test_lockstep_emits_an_empty_batch_when_nothing_had_signal() -> None:
    feed = _lockstep(expected_peers=0)
    for _ in range(3):
        feed.group("local", "node-0", T0, round_=0, signal=False)
    batch = feed.assembler.next_batch(T0, 0)
    assert batch is not None
    assert batch.round == 0
    assert batch.entries == []


def test_lockstep_does_not_stall_on_a_lost_local_group() -> None:
    feed = _lockstep(expected_peers=0)
    feed.group("local", "node-0", T0, round_=0)
    feed.group("local", "node-0", T0, round_=0)
    assert feed.assembler.next_batch(T0 + 99, 0) is None
    batch = feed.assembler.next_batch(T0 + 100, 0)
    assert batch is not None
    assert len(batch.local) == 2


def test_lockstep_follows_the_generator_past_missing_rounds_but_never_back() -> None:
    feed = _lockstep(expected_peers=0)
    feed.group("external", "peer-1", T0, round_=1)
    for _ in range(3):
        feed.group("local", "node-0", T0, round_=4)
    batch = feed.assembler.next_batch(T0, 0)
    assert batch is not None
    assert batch.round == 4
    unused = Counter((d.entry.scored.round, d.reason) for d in feed.assembler.take_discards())
    assert unused == Counter({(1, "unused"): 1, (4, "unused"): 1})  # round 1's group, round 4's third
    assert feed.group("external", "peer-1", T0, round_=3) == "late_round"
    assert feed.group("external", "peer-1", T0, round_=5 + LOCKSTEP_WINDOW) == "future_round"


def test_lockstep_without_external_slots_never_waits_for_peers() -> None:
    feed = _lockstep(mix=Mix(3, 0), expected_peers=5)
    for _ in range(3):
        feed.group("local", "node-0", T0, round_=0)
    batch = feed.assembler.next_batch(T0, 0)
    assert batch is not None
    assert len(batch.local) == 3
    assert not batch.waited_out


def test_the_choice_is_reproducible_per_sequence() -> None:
    def choose() -> list[str]:
        feed = _lockstep(questions_per_round=6, expected_peers=0, mix=Mix(3, 0))
        for _ in range(6):
            feed.group("local", "node-0", T0, round_=0)
        batch = feed.assembler.next_batch(T0, 7)
        assert batch is not None
        return [e.handle for e in batch.local]

    assert choose() == choose()


@pytest.mark.parametrize("mode", [RoundMode.ASYNC, RoundMode.DEADLINE])
def test_streaming_batch_is_due_after_a_round_without_enough_local_signal(mode: RoundMode) -> None:
    """A node whose round had fewer than I groups with signal must still get a batch (and a policy
    version), or a generator bounded by max_ahead and its sampler wait on each other for ever."""
    feed = Feed(make_assembler(_config(mode)))
    feed.group("local", "node-0", T0)
    feed.group("local", "node-0", T0, signal=False)
    feed.group("external", "peer-1", T0)
    assert feed.assembler.next_batch(T0, 0) is None  # 2 of the round's 3 local groups so far
    duplicate = scored("local", "node-0")
    feed.assembler.arrived(duplicate.peer, duplicate.group_id, duplicate.round, "local", T0)  # arrived only
    assert feed.assembler.next_batch(T0, 0) is None
    feed.group("local", "node-0", T0, signal=False)
    batch = feed.assembler.next_batch(T0, 0)
    assert batch is not None
    assert ([e.handle for e in batch.local], [e.scored.peer for e in batch.external]) == (
        ["local-1"],
        ["peer-1"],
    )
    assert feed.assembler.next_batch(T0, 1) is None  # the count starts afresh
    for _ in range(3):
        feed.group("local", "node-0", T0 + 1, signal=False)
    empty = feed.assembler.next_batch(T0 + 1, 1)
    assert empty is not None and empty.entries == []  # nothing to train, but the version advances


def test_streaming_with_enough_signal_still_waits_for_the_external_groups() -> None:
    feed = Feed(make_assembler(_config(RoundMode.ASYNC)))
    for _ in range(6):  # two rounds of local groups, all with signal
        feed.group("local", "node-0", T0)
    assert feed.assembler.next_batch(T0 + 100, 0) is None  # J external are still missing
