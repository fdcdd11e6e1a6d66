"""The pure sampler core: admission, lock-step batches, numbering and what a restart continues from."""

from __future__ import annotations

import time

import pytest

from sapo import wire
from sapo.identity import Sender
from sapo.sampler import History, Origin, SamplerCore, Unread, next_sequence_of, parse
from sapo.sampler.assembler import LOCKSTEP_WINDOW
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2
from sapo.wire import InvalidMessageError
from tests.unit.sampler.builders import questions, real_group, sampler_core

pytestmark = pytest.mark.unit

NODE = "node-0"
RECORDS = questions(node_seed=23, count=8)


def _core(history: History | None = None, **overrides: object) -> SamplerCore[str]:
    values: dict[str, object] = {
        "node_id": NODE,
        "local_groups": 2,
        "external_groups": 1,
        "questions_per_round": 2,
        "expected_peers": 1,
    }
    return sampler_core(history, values | overrides)


def admit(
    core: SamplerCore[str], group: rollout_pb2.RolloutGroup, origin: Origin, handle: str, now: float
) -> str | None:
    """`admit` of a group whose sender was verified to be the node it names."""
    return core.admit(group, origin, handle, now, Sender(group.node_id))


def test_a_round_of_own_and_peer_groups_becomes_batch_zero_then_one() -> None:
    core = _core()
    now = time.time()
    for index, record in enumerate(RECORDS[:2]):
        assert admit(core, real_group(record, NODE), "local", f"l{index}", now) is None
    assert core.next_batch(now) is None  # the peer of round 0 has not arrived yet
    assert admit(core, real_group(RECORDS[2], "peer-1"), "external", "e0", now) is None
    assembly = core.next_batch(now)
    assert assembly is not None
    assert sorted(e.handle for e in assembly.entries) == ["e0", "l0", "l1"]
    batch = core.build(assembly, [("t", 0, 1)], wire.now_timestamp())
    assert (batch.batch_id, batch.sequence, batch.round) == (f"{NODE}/0", 0, 0)
    assert [bg.source for bg in batch.groups].count(batch_pb2.GROUP_SOURCE_EXTERNAL) == 1
    assert core.build(assembly, [], wire.now_timestamp()).sequence == 0  # unpublished: same number
    core.emitted()
    assert core.sequence == 1


def test_rejections_are_reasons_and_duplicates_are_caught_after_pooling() -> None:
    core = _core()
    now = time.time()
    group = real_group(RECORDS[0], NODE)
    assert admit(core, group, "local", "a", now) is None
    assert admit(core, group, "local", "b", now) == "duplicate"
    assert admit(core, real_group(RECORDS[1], NODE, (True, True)), "local", "c", now) == "no_signal"
    assert admit(core, real_group(RECORDS[2], NODE), "external", "d", now) == "own_node"


def test_a_restart_continues_numbering_and_refuses_groups_already_trained() -> None:
    trained = real_group(RECORDS[0], NODE, round_=6, policy_version=6)
    core = _core(History(next_sequence=7, next_round=7, used_group_ids=(trained.group_id,)))
    assert core.sequence == 7
    assert admit(core, trained, "local", "x", time.time()) == "duplicate"


def test_forgotten_groups_leave_the_pool_and_may_come_again() -> None:
    core = _core()
    now = time.time()
    group = real_group(RECORDS[3], "peer-1")
    assert admit(core, group, "external", "e", now) is None
    core.forget({group.group_id})
    assert core.assembler.pool.count("external") == 0
    assert admit(core, group, "external", "e-again", now) is None


def test_a_group_that_is_not_its_senders_is_refused_before_it_counts_as_an_arrival() -> None:
    """Lock-step arrival and per-peer quotas read the group's node id: a group must name the node
    that (verifiably) sent it, or peer-2 could close peer-1's round."""
    core = _core()
    now = time.time()
    for index, record in enumerate(RECORDS[:2]):
        assert admit(core, real_group(record, NODE), "local", f"l{index}", now) is None
    with pytest.raises(InvalidMessageError, match="identity_mismatch"):
        core.admit(real_group(RECORDS[2], "peer-1"), "external", "forged", now, Sender("peer-2", "k2"))
    assert core.next_batch(now) is None  # peer-1 has not arrived
    assert core.admit(real_group(RECORDS[3], "peer-1"), "external", "e", now, Sender("peer-1", "k1")) is None
    assembly = core.next_batch(now)
    assert assembly is not None and sorted(e.handle for e in assembly.entries) == ["e", "l0", "l1"]


@pytest.mark.parametrize(("keep", "local_groups"), [(False, 1), (True, 2)])
def test_the_reference_baseline_trains_on_own_zero_advantage_groups(keep: bool, local_groups: int) -> None:
    core = _core(keep_local_zero_advantage=keep)
    now = time.time()
    no_signal = real_group(RECORDS[0], NODE, (True, True), round_=0)
    assert admit(core, no_signal, "local", "l0", now) == (None if keep else "no_signal")
    assert admit(core, real_group(RECORDS[1], NODE, (True, False), round_=0), "local", "l1", now) is None
    peer_flat = real_group(RECORDS[6], "peer-1", (False, False), round_=0)
    assert admit(core, peer_flat, "external", "e0", now) == "no_signal"  # the swarm's is always filtered
    assert (
        admit(core, real_group(RECORDS[7], "peer-1", (True, False), round_=0), "external", "e1", now) is None
    )
    assembly = core.next_batch(now)
    assert assembly is not None
    batch = core.build(assembly, [], wire.now_timestamp())
    sources = [bg.source for bg in batch.groups]
    assert sources.count(batch_pb2.GROUP_SOURCE_LOCAL) == local_groups
    assert sources.count(batch_pb2.GROUP_SOURCE_EXTERNAL) == 1


# --- following the trainer: a batch topic that lost its history (a reinstall with the checkpoints kept)


def test_an_empty_history_with_a_trainer_announcement_numbers_after_what_was_trained() -> None:
    """Lock-step, the trainer at version 40 expects sequence 40: the node's round-40 groups are not
    refused as `future_round` (40 rounds past an empty history's round 0) and make batch 40."""
    core = _core(History(trainer_next_sequence=40, trainer_version=40), external_groups=0, expected_peers=0)
    assert core.sequence == 40
    now = time.time()
    for index, record in enumerate(RECORDS[:2]):
        group = real_group(record, NODE, round_=40, policy_version=40)
        assert admit(core, group, "local", f"l{index}", now) is None
    assembly = core.next_batch(now)
    assert assembly is not None
    batch = core.build(assembly, [], wire.now_timestamp())
    assert (batch.batch_id, batch.round, batch.target_policy_version) == (f"{NODE}/40", 40, 40)


def test_an_own_groups_policy_version_is_a_floor_for_the_next_sequence() -> None:
    """The trainer announced version 9 before the group was sampled with it, so it trained 9 batches:
    even before its announcement is read, the next batch is not numbered below 9."""
    core = _core(round_mode="async", local_groups=1, external_groups=0)
    now = time.time()
    assert admit(core, real_group(RECORDS[0], "peer-1", policy_version=30), "external", "e", now) is None
    assert core.sequence == 0  # a peer's version says nothing about our trainer
    assert admit(core, real_group(RECORDS[1], NODE, policy_version=9), "local", "l", now) is None
    assert core.sequence == 9
    admit(core, real_group(RECORDS[2], NODE, policy_version=4), "local", "m", now)  # "stale"
    assert core.sequence == 9  # never back


def test_the_trainers_announcement_moves_the_sequence_and_lockstep_round_forward_only() -> None:
    core = _core(History(next_sequence=3, next_round=3))
    now = time.time()
    old = real_group(RECORDS[0], NODE, round_=3, policy_version=3)
    assert admit(core, old, "local", "old", now) is None
    assert core.follow_trainer(12, 11) == 3  # it trained up to sequence 11 (a gap: version 11)
    assert core.sequence == 12
    assert [(d.entry.handle, d.reason) for d in core.take_discards()] == [("old", "late_round")]
    assert core.follow_trainer(5, 5) is None
    assert core.sequence == 12


def test_next_sequence_of_an_announcement() -> None:
    update = policy_pb2.PolicyUpdate(node_id=NODE, version=7, sequence=9)  # after gaps: 9 > 7 - 1
    assert next_sequence_of(update) == 10
    assert next_sequence_of(policy_pb2.PolicyUpdate(node_id=NODE, version=7)) == 7  # no field: a floor
    assert next_sequence_of(policy_pb2.PolicyUpdate(node_id=NODE, version=0)) == 0


def test_a_group_admitted_on_its_facts_gets_the_place_its_decoded_body_gets() -> None:
    """`admit_unread` asks the pool for a place before it builds the group's pooled form: the
    verdicts (a full pool's fair shares, a round beyond the lock-step window, a re-delivery) and what
    ends up pooled are those of the same records decoded on arrival."""
    on_facts, decoded = _core(verify="lazy", max_pool_groups=3), _core(verify="lazy", max_pool_groups=3)
    now = time.time()
    arrivals = [
        ("peer-1", 0),
        ("peer-1", 0),
        ("peer-1", 0),  # the pool is full
        ("peer-2", 0),  # in place of peer-1's oldest: peer-2 then holds fewer
        ("peer-2", 0),  # refused: peer-2 would then hold as many as peer-1
        ("peer-3", LOCKSTEP_WINDOW + 1),
    ]
    records = []
    for i, (peer, round_) in enumerate(arrivals):
        group = real_group(RECORDS[i], peer, round_=round_)
        value = group.SerializeToString()
        records.append((value, dict(wire.rollout_headers(group, value)), peer))
    records.append(records[0])  # a re-delivery of the evicted group
    verdicts = []
    for value, headers, peer in records:
        facts = wire.read_facts(headers)
        assert facts is not None
        got = on_facts.admit_unread(Unread(value, headers, facts), peer, now, Sender(peer))
        want = decoded.admit(parse(value, 1 << 20, headers), "external", peer, now, Sender(peer))
        verdicts.append((got, want))
    assert [got for got, _ in verdicts] == [want for _, want in verdicts]
    assert [got for got, _ in verdicts] == [None, None, None, None, "pool_full", "future_round", "duplicate"]
    pooled = [core.assembler.pool.entries("external") for core in (on_facts, decoded)]
    assert [e.group_id for e in pooled[0]] == [e.group_id for e in pooled[1]]
    assert [e.handle for e in pooled[0]] == ["peer-1", "peer-1", "peer-2"]
    assert [e.scored.verified for e in pooled[0]] == [False] * 3
