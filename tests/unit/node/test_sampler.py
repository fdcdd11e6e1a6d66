"""The service core over the in-memory transport: both streams, dead letters, metrics, batches, offsets
committed only after the batch, recovery after a crash, and partitions taken away."""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from sapo import wire
from sapo.identity import NodeKey, TrustStore
from sapo.identity.announce import add_statement, announcement, record_key
from sapo.identity.signing import H_SIGNATURE_V2
from sapo.kafka import DeadLetters, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.kafka.records import AssignHook, RevokeHook
from sapo.lifecycle import StopFlag
from sapo.node.identity import IdentityGate, IdentityMetrics, KeysFollower
from sapo.node.metrics import SamplerMetrics
from sapo.node.peers import OTHER
from sapo.node.recovery import read_history
from sapo.node.sampler import IDLE_WAIT_MAX_S, IDLE_WAIT_S, SWARM_BURST, SamplerService
from sapo.ops import Health
from sapo.sampler.settings import SamplerSettings
from sapo.topics import TopicNames
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2
from sapo.wire import validate_batch
from tests.services import start_service
from tests.unit.sampler.builders import encoded, questions, real_group

pytestmark = pytest.mark.unit

NODE = "node-0"
TOPICS = TopicNames.for_node(NODE, "t")
RECORDS = questions(node_seed=5, count=12)


class LosableClient(MemoryConsumerClient):
    """A memory client that can lose its partitions the way librdkafka's on_lost callback does."""

    def subscribe(
        self, topics: Sequence[str], on_assign: AssignHook, on_revoke: RevokeHook, on_lost: RevokeHook
    ) -> None:
        self._lost = (on_lost, list(topics))
        super().subscribe(topics, on_assign, on_revoke, on_lost)

    def lose(self) -> None:
        on_lost, topics = self._lost
        on_lost([(t, 0) for t in topics])


class Node:
    """One sampler core on a shared bus; `restart()` builds a fresh one as a restarted process would."""

    def __init__(
        self,
        bus: MemoryBus,
        trust: TrustStore | None = None,
        stop: StopFlag | None = None,
        clock: Callable[[], float] = time.time,
        **settings: object,
    ) -> None:
        self.bus = bus
        self.stop = stop
        self.clock = clock
        self.settings = SamplerSettings(node_id=NODE, **settings)  # type: ignore[arg-type]
        self.registry = CollectorRegistry()
        self.trust = trust
        self.service = self._build()

    def _build(self) -> SamplerService:
        stop = self.stop or StopFlag()
        history = read_history(
            MemoryConsumerClient(self.bus, f"recovery-{id(self)}-{len(self.bus.topics)}"),
            TOPICS.batches,
            NODE,
            max_bytes=1 << 24,
            idle_s=0.0,
            timeout_s=5.0,
            stop=stop,
            beat=lambda: None,
            policy_topic=TOPICS.policy,
        )
        assert history is not None
        self.registry = CollectorRegistry()
        transport = TransportMetrics(self.registry, "sampler")
        publisher = MemoryPublisher(self.bus)
        self.swarm_client = LosableClient(self.bus, "swarm")
        identity = None
        if self.trust is not None:  # wired as sapo.node.sampler.identity_gate wires it
            metrics = IdentityMetrics(self.registry, "sampler")
            keys = MemoryConsumerClient(self.bus, f"keys-{id(self)}-{len(self.bus.topics)}")
            follower = KeysFollower(
                keys,
                TOPICS.swarm_keys,
                self.trust,
                metrics=metrics,
                transport=transport,
                stop=stop,
                dead_letters=None,
            )
            identity = IdentityGate(self.trust, metrics, follower=follower)
            identity.open()
        core = SamplerService(
            self.settings,
            TOPICS,
            history=history,
            publisher=publisher,
            local_client=LosableClient(self.bus, "local"),
            swarm_client=self.swarm_client,
            metrics=SamplerMetrics(self.registry),
            transport=transport,
            health=Health(),
            stop=stop,
            dead_letters=DeadLetters(publisher, TOPICS.dlq, "sampler", transport),
            identity=identity,
            trainer_client=MemoryConsumerClient(self.bus, f"policy-{id(self)}-{len(self.bus.topics)}"),
            clock=self.clock,
        )
        assert core.trainer is not None
        core.trainer.open()
        core.local.open()
        core.swarm.open()
        return core

    def restart(self) -> None:
        """The old core is dropped without close(): a SIGKILL, nothing more is committed."""
        self.service = self._build()

    def drain(self) -> None:
        while self.service.step():
            pass
        self.service.step()

    def batches(self) -> list[batch_pb2.TrainingBatch]:
        out = []
        for value in self.bus.values(TOPICS.batches):
            batch = batch_pb2.TrainingBatch()
            batch.ParseFromString(value)
            out.append(batch)
        return out

    def rejected(self, reason: str) -> float:
        return self.registry.get_sample_value("sapo_sampler_groups_rejected_total", {"reason": reason}) or 0.0


def publish(bus: MemoryBus, topic: str, group: rollout_pb2.RolloutGroup, key: NodeKey | None = None) -> None:
    value, headers = encoded(group, key)
    bus.append(topic, group.group_id.encode(), value, headers)


def _record_cycle() -> itertools.cycle[int]:
    return itertools.cycle(range(len(RECORDS)))


class PauseLog(StopFlag):
    """A stop flag that is never set and records each pause instead of sleeping it."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.pauses.append(timeout)
        return False


def test_an_idle_sampler_pauses_longer_each_step_and_a_record_resets_the_pause() -> None:
    bus = MemoryBus()
    stop = PauseLog()
    node = Node(bus, stop=stop, round_mode="async")
    for _ in range(5):
        assert not node.service.step()
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE))
    assert node.service.step()
    assert not node.service.step()
    doubling = [IDLE_WAIT_S * 2**i for i in range(5)]
    assert stop.pauses == [min(p, IDLE_WAIT_MAX_S) for p in doubling] + [IDLE_WAIT_S]
    assert IDLE_WAIT_MAX_S in stop.pauses  # the pause is bounded, and reached within five steps


def test_a_step_reads_a_burst_of_swarm_records_and_polls_the_node_s_own_stream_once() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async")
    swarm = SWARM_BURST + 6
    for i in range(swarm):
        publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[i % len(RECORDS)], f"peer-{i}"))
    for record in RECORDS[:2]:
        publish(bus, TOPICS.rollouts, real_group(record, NODE))
    assert node.service.step()
    assert (node.service.swarm.handled, node.service.local.handled) == (SWARM_BURST, 1)
    assert node.service.step()
    assert (node.service.swarm.handled, node.service.local.handled) == (swarm, 2)
    assert not node.service.step()


def test_async_batches_mix_local_and_external_and_reject_bad_input() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=2, external_groups=2, max_per_source=1)
    idx = _record_cycle()
    for _ in range(4):
        publish(bus, TOPICS.rollouts, real_group(RECORDS[next(idx)], NODE))
    for peer in ("peer-1", "peer-2"):
        for _ in range(2):
            publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[next(idx)], peer))
    dup = real_group(RECORDS[next(idx)], "peer-3")
    publish(bus, TOPICS.swarm_rollouts, dup)
    publish(bus, TOPICS.swarm_rollouts, dup)
    tampered = real_group(RECORDS[next(idx)], "peer-3")
    tampered.question.answer = "42"
    publish(bus, TOPICS.swarm_rollouts, tampered)
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[next(idx)], NODE))  # our own echo
    bus.append(TOPICS.swarm_rollouts, b"junk", b"\xff\xff\xff", [])
    node.drain()

    batches = node.batches()
    assert [b.batch_id for b in batches] == [f"{NODE}/0", f"{NODE}/1"]
    for batch in batches:
        assert validate_batch(batch) is None
        sources = [bg.source for bg in batch.groups]
        assert sources == [batch_pb2.GROUP_SOURCE_LOCAL] * 2 + [batch_pb2.GROUP_SOURCE_EXTERNAL] * 2
        assert len({bg.group.node_id for bg in batch.groups[2:]}) == 2  # quota: one per peer
    assert node.rejected("duplicate") == 1
    assert node.rejected("answer_mismatch") == 1
    assert node.rejected("own_node") == 1
    assert node.rejected("undecodable") == 1
    dlq = {h["sapo-dlq-reason"] for h in (r.headers for r in bus.topics[TOPICS.dlq])}
    assert dlq == {b"answer_mismatch", b"undecodable"}
    consumed = node.registry.get_sample_value("sapo_sampler_groups_consumed_total", {"origin": "external"})
    assert consumed == 9
    # Each batch carries the per-peer intake since the previous one: its used counts are its groups.
    for batch in batches:
        used = collections.Counter(bg.group.node_id for bg in batch.groups[2:])
        assert {i.node_id: i.used for i in batch.intake if i.used} == used
    received: collections.Counter[str] = collections.Counter()
    for batch in batches:
        received.update({i.node_id: i.received for i in batch.intake})
    assert received.keys() <= {"peer-1", "peer-2", "peer-3"}  # own echo and junk named no peer
    assert received["peer-1"] <= 2 and received["peer-2"] <= 2 and received["peer-3"] <= 3
    assert received.total() >= 4  # at least the groups used (later arrivals go in the next batch)


def test_offsets_are_committed_only_after_the_batch_is_acknowledged() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=1)
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE))
    node.drain()
    node.service.local.commit()
    assert bus.committed[("local", (TOPICS.rollouts, 0))] == 0  # pooled, not in a batch yet
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[1], "peer-1"))
    node.drain()
    assert len(node.batches()) == 1
    node.service.close()
    assert bus.committed[("local", (TOPICS.rollouts, 0))] == 1
    assert bus.committed[("swarm", (TOPICS.swarm_rollouts, 0))] == 1


def test_a_crash_after_the_batch_neither_repeats_a_batch_nor_reuses_a_group() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=1)
    groups = [real_group(r, NODE) for r in RECORDS[:3]]
    for g in groups:
        publish(bus, TOPICS.rollouts, g)
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[3], "peer-1"))
    node.drain()
    assert len(node.batches()) == 1
    node.restart()  # nothing was committed: everything is re-delivered
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[4], "peer-1"))
    node.drain()
    batches = node.batches()
    assert [b.sequence for b in batches] == [0, 1]
    used = [bg.group.group_id for b in batches for bg in b.groups]
    assert len(used) == len(set(used)) == 4
    assert node.rejected("duplicate") == 2  # the local and the external group of batch 0


def test_lockstep_emits_empty_batches_to_advance_the_round() -> None:
    bus = MemoryBus()
    node = Node(bus, questions_per_round=2, local_groups=2, external_groups=1, expected_peers=1)
    for round_ in (0, 1):
        for record in RECORDS[2 * round_ : 2 * round_ + 2]:
            publish(bus, TOPICS.rollouts, real_group(record, NODE, (True, True), round_=round_))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[6], "peer-1", (True, True), round_=0))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[7], "peer-1", round_=1))
    node.drain()
    batches = node.batches()
    assert [(b.round, len(b.groups)) for b in batches] == [(0, 0), (1, 1)]
    assert all(validate_batch(b) is None for b in batches)
    assert node.rejected("no_signal") == 5


def test_a_round_closed_by_the_lockstep_timeout_is_counted_as_waited_out() -> None:
    """The operator's signal that the swarm is smaller or slower than EXPECTED_PEERS says."""
    bus, now = MemoryBus(), [time.time()]
    node = Node(
        bus,
        clock=lambda: now[0],
        questions_per_round=2,
        local_groups=2,
        external_groups=2,
        expected_peers=2,
        lockstep_timeout_s=30.0,
    )
    records = iter(RECORDS)
    for round_, peers in ((0, ["peer-1"]), (1, ["peer-1", "peer-2"])):
        for _ in range(2):
            publish(bus, TOPICS.rollouts, real_group(next(records), NODE, (True, False), round_=round_))
        for peer in peers:
            publish(bus, TOPICS.swarm_rollouts, real_group(next(records), peer, (True, False), round_=round_))
    node.drain()
    assert node.batches() == []  # round 0 waits for its second peer
    now[0] += 30.0
    node.drain()
    assert [(b.round, len(b.groups)) for b in node.batches()] == [(0, 3), (1, 4)]

    def waited_out(mode: str) -> float | None:
        return node.registry.get_sample_value("sapo_sampler_batches_waited_out_total", {"mode": mode})

    assert (waited_out("lockstep"), waited_out("async"), waited_out("deadline")) == (1.0, 0.0, 0.0)


def test_lost_partitions_drop_their_pool_and_their_groups_are_accepted_again() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=1)
    group = real_group(RECORDS[0], "peer-1")
    publish(bus, TOPICS.swarm_rollouts, group)
    node.drain()
    assert node.service.core.assembler.pool.count("external") == 1
    node.swarm_client.lose()
    assert node.service.core.assembler.pool.count("external") == 0
    assert group.group_id not in node.service.core.screen.seen


def test_lazy_rejects_bad_picks_with_their_reasons_and_finishes_their_offsets() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=2, verify="lazy")
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE))
    tampered = real_group(RECORDS[1], "peer-1")
    tampered.question.answer += "0"
    no_signal = real_group(RECORDS[2], "peer-2", (False, False, False))
    no_signal.completions[0].reward = 1.0  # claims a signal the receiver's verifier does not find
    forged = real_group(RECORDS[3], "peer-3", (True, False, False))
    forged.completions[1].reward = 1.0  # claims a wrong answer is right: kept, rewards recomputed
    unclaimed = real_group(RECORDS[4], "peer-4", (True, False))
    unclaimed.completions[0].reward = 0.0  # under-reports: only hurts itself
    for group in (tampered, no_signal, forged, unclaimed):
        publish(bus, TOPICS.swarm_rollouts, group)
    node.drain()
    assert node.batches() == []  # one good external group of the three pooled: J=2 waits
    assert node.rejected("answer_mismatch") == 1
    assert node.rejected("no_signal") == 1
    assert node.rejected("no_signal_claimed") == 1
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]] == [b"answer_mismatch"]
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[5], "peer-5"))
    node.drain()
    [batch] = node.batches()
    assert validate_batch(batch) is None
    assert batch.groups[0].group.node_id == NODE
    assert sorted(bg.group.node_id for bg in batch.groups[1:]) == ["peer-3", "peer-5"]
    [forged_bg] = [bg for bg in batch.groups if bg.group.group_id == forged.group_id]
    assert forged_bg.group.completions[1].reward == 1.0
    assert forged_bg.rewards[0] == 1.0
    assert forged_bg.rewards[1] < 1.0
    node.service.close()
    assert bus.committed[("swarm", (TOPICS.swarm_rollouts, 0))] == 5  # rejected picks finished too


def test_lockstep_counts_only_verified_arrivals_and_follows_a_key_rotation() -> None:
    """An impersonator cannot close a peer's lock-step round; the peer's rotation announced on the
    keys topic takes effect between rounds without a restart."""
    bus = MemoryBus()
    peer, mallory = NodeKey.generate(), NodeKey.generate()
    trust = TrustStore()
    trust.add("peer-1", peer.public, "file")
    trust.add("peer-m", mallory.public, "file")
    node = Node(
        bus,
        trust,
        questions_per_round=2,
        local_groups=2,
        external_groups=1,
        expected_peers=1,
        max_per_source=1,
    )
    for record in RECORDS[:2]:
        publish(bus, TOPICS.rollouts, real_group(record, NODE, round_=0))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[2], "peer-1", round_=0), mallory)  # impersonation
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[3], "peer-1", round_=0))  # unsigned
    node.drain()
    assert node.batches() == []  # peer-1 has not arrived: round 0 waits for it
    assert node.rejected("identity_mismatch") == 1
    assert node.rejected("unsigned") == 1
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]] == [
        b"identity_mismatch",
        b"unsigned",
    ]

    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[4], "peer-1", round_=0), peer)
    node.drain()
    [batch0] = node.batches()
    assert [bg.group.node_id for bg in batch0.groups] == [NODE, NODE, "peer-1"]

    new = NodeKey.generate()
    rotation = add_statement("peer-1", new.public, time.time(), previous_key_id=peer.key_id, overlap_s=600)
    bus.append(TOPICS.swarm_keys, record_key(rotation), announcement(rotation, [new, peer]), [])
    for record in RECORDS[5:7]:
        publish(bus, TOPICS.rollouts, real_group(record, NODE, round_=1))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[7], "peer-1", round_=1), new)
    node.drain()
    assert [b.round for b in node.batches()] == [0, 1]
    assert node.batches()[1].groups[-1].group.node_id == "peer-1"
    assert node.registry.get_sample_value("sapo_sampler_key_announcements_total", {"result": "rotated"}) == 1


def test_a_full_pool_refuses_a_peer_s_group_before_identifying_or_decoding_it() -> None:
    """Load shedding: a full pool shared by peer-1 and peer-2 has no place for a newcomer's group, so
    groups naming peer-3 are refused pool_full unread (a forgery and a malformed record too: not
    identified or decoded, so not dead-lettered); a forgery naming peer-1, which may replace its own
    group, is identified and dead-lettered as before."""
    bus = MemoryBus()
    peer, other, mallory = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    trust = TrustStore()
    trust.add("peer-1", peer.public, "file")
    trust.add("peer-2", other.public, "file")
    node = Node(bus, trust, round_mode="async", max_pool_groups=2)
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[0], "peer-1"), peer)
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[1], "peer-2"), other)
    node.drain()
    assert (node.service.core.sheds("peer-3"), node.service.core.sheds("peer-1")) == ("pool_full", None)

    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[2], "peer-3"), mallory)  # shed
    bus.append(TOPICS.swarm_rollouts, b"junk", b"\xff\xff", [(wire.H_NODE, b"peer-3")])  # shed
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[3], "peer-1"), mallory)  # identified
    node.drain()
    assert node.rejected("pool_full") == 2
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]] == [b"key_conflict"]
    assert node.service.swarm.watermarks.pending_count() == 2  # the two pooled groups, nothing else
    peer_rejected = "sapo_sampler_peer_groups_rejected_total"
    assert node.registry.get_sample_value(peer_rejected, {"peer": OTHER, "reason": "pool_full"}) is None


def test_with_identity_a_lazy_sampler_pools_on_signed_facts_only() -> None:
    """Facts the v2 signature covers are pooled on undecoded; a copy of peer-1's record with other facts
    and the v2 signature stripped still verifies by v1, but its facts are set aside and its body
    decoded: a duplicate of the group it copies, not a new group, nothing dead-lettered in peer-1's
    name. An older signer's record (v1 alone) is decoded on arrival and taken."""
    bus = MemoryBus()
    peer = NodeKey.generate()
    trust = TrustStore()
    trust.add("peer-1", peer.public, "file")
    node = Node(bus, trust, round_mode="async", local_groups=1, external_groups=2, verify="lazy")
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE))
    signed, older = real_group(RECORDS[1], "peer-1"), real_group(RECORDS[2], "peer-1")
    publish(bus, TOPICS.swarm_rollouts, signed, peer)
    value, headers = encoded(signed, peer)
    lie = wire.group_facts(signed)._replace(group_id="00000000-0000-4000-8000-000000000001")
    copied = [
        (k, wire.encode_facts(lie) if k == wire.H_FACTS else v) for k, v in headers if k != H_SIGNATURE_V2
    ]
    bus.append(TOPICS.swarm_rollouts, lie.group_id.encode(), value, copied)
    value, headers = encoded(older, peer)
    bus.append(
        TOPICS.swarm_rollouts, older.group_id.encode(), value, [h for h in headers if h[0] != H_SIGNATURE_V2]
    )
    node.drain()
    [batch] = node.batches()
    assert sorted(bg.group.group_id for bg in batch.groups[1:]) == sorted([signed.group_id, older.group_id])
    assert node.rejected("duplicate") == 1
    assert TOPICS.dlq not in bus.topics or not bus.topics[TOPICS.dlq]


def test_without_identity_a_node_header_that_names_nobody_is_refused_before_it_is_shed() -> None:
    """Identity off, the node header is the sender: one that is no node id is dead-lettered as
    bad_node_id, also where a full pool would shed it, and never counted for a peer; a newcomer that
    is a node is shed and counted for it (unlabelled: none of its groups passed yet)."""
    bus = MemoryBus()
    node = Node(bus, round_mode="async", max_pool_groups=2)
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[0], "peer-1"))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[1], "peer-2"))
    node.drain()
    for claim in (b"Peer-3", b"peer-3"):
        assert node.service.core.sheds(claim.decode()) == "pool_full"
        bus.append(TOPICS.swarm_rollouts, b"junk", b"\xff\xff", [(wire.H_NODE, claim)])
    node.drain()
    assert (node.rejected("bad_node_id"), node.rejected("pool_full")) == (1, 1)
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]] == [b"bad_node_id"]
    peer_rejected = "sapo_sampler_peer_groups_rejected_total"
    assert node.registry.get_sample_value(peer_rejected, {"peer": OTHER, "reason": "pool_full"}) == 1


def announce(bus: MemoryBus, version: int, sequence: int | None, *, epoch: int = 0, node: str = NODE) -> None:
    """A trainer's PolicyUpdate on the node's policy topic (the sampler reads no weights from it)."""
    update = policy_pb2.PolicyUpdate(
        schema_version=1,
        node_id=node,
        version=version,
        manifest_uri=f"file:///checkpoints/{node}/v{version}/manifest.json",
        manifest_sha256="0" * 64,
        epoch=epoch,
    )
    if sequence is not None:
        update.sequence = sequence
    bus.append(TOPICS.policy, node.encode(), update.SerializeToString(), [])


def test_a_reinstalled_node_numbers_its_batches_after_what_its_trainer_trained() -> None:
    """Kept checkpoints, new topics: the batch topic is empty, the trainer announced version 5 (last
    trained sequence 4). The sampler's next batch is 5, not 0 (which the trainer would skip), and
    announcements made later move it on; foreign and fenced ones do not."""
    bus = MemoryBus()
    announce(bus, 5, 4, epoch=1)
    node = Node(bus, round_mode="async", local_groups=1, external_groups=0)
    assert node.service.sequence == 5  # from recovery, before anything was consumed
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE, policy_version=5))
    node.drain()
    assert [b.batch_id for b in node.batches()] == [f"{NODE}/5"]

    announce(bus, 7, 9, epoch=1)  # two sequences lost upstream: the trainer expects 10
    announce(bus, 50, 49, node="node-x")  # not this node's trainer
    announce(bus, 60, 59, epoch=0)  # a trainer fenced out by epoch 1
    bus.append(TOPICS.policy, NODE.encode(), b"\xff\xff", [])
    publish(bus, TOPICS.rollouts, real_group(RECORDS[1], NODE, policy_version=6))
    node.drain()
    assert [b.batch_id for b in node.batches()] == [f"{NODE}/5", f"{NODE}/10"]
    sample = node.registry.get_sample_value
    assert sample("sapo_sampler_sequence_jumps_total") == 2
    assert sample("sapo_sampler_messages_rejected_total", {"reason": "foreign_node"}) == 1
    assert sample("sapo_sampler_messages_rejected_total", {"reason": "undecodable"}) == 1
    assert TOPICS.dlq not in bus.topics  # the generators dead-letter bad updates, not the sampler


def test_an_own_group_sampled_with_version_v_numbers_the_next_batch_at_least_v() -> None:
    """No announcement read yet (it is on its way): the group's policy version is enough."""
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=0)
    assert node.service.sequence == 0
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE, policy_version=3))
    node.drain()
    assert [b.batch_id for b in node.batches()] == [f"{NODE}/3"]
    assert node.registry.get_sample_value("sapo_sampler_sequence_jumps_total") == 1


def test_an_intact_batch_topic_is_not_overridden_by_older_announcements() -> None:
    """The usual restart: batches 0..2 emitted, the trainer announced up to sequence 1."""
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=0)
    for index in range(3):
        publish(bus, TOPICS.rollouts, real_group(RECORDS[index], NODE, policy_version=index))
        node.drain()
    announce(bus, 2, 1)
    node.restart()
    assert node.service.sequence == 3
    assert node.registry.get_sample_value("sapo_sampler_sequence_jumps_total") == 0


def test_lazy_pools_on_facts_dead_letters_their_lies_when_picked_and_decodes_older_senders() -> None:
    """Swarm records with a facts header are pooled undecoded; a lying one (claims a spread its body
    does not) is dead-lettered as facts_mismatch when picked, and one without the header (an older
    sender) is decoded on arrival: both kinds make the batch."""
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=2, verify="lazy")
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE))
    liar = real_group(RECORDS[1], "peer-1", (True, False))
    claimed = rollout_pb2.RolloutGroup()
    claimed.CopyFrom(liar)
    liar.completions[0].reward = 0.0  # the body claims no spread; its header, made before, does
    value = liar.SerializeToString()
    bus.append(TOPICS.swarm_rollouts, liar.group_id.encode(), value, wire.rollout_headers(claimed, value))
    honest = real_group(RECORDS[2], "peer-2")
    older = real_group(RECORDS[3], "peer-3")
    publish(bus, TOPICS.swarm_rollouts, honest)
    node.drain()
    assert node.batches() == []  # J=2 walked both: the liar was decoded and refused
    assert node.rejected("facts_mismatch") == 1
    value, headers = encoded(older)
    bus.append(
        TOPICS.swarm_rollouts, older.group_id.encode(), value, [h for h in headers if h[0] != wire.H_FACTS]
    )
    node.drain()
    [batch] = node.batches()
    assert sorted(bg.group.group_id for bg in batch.groups[1:]) == sorted([honest.group_id, older.group_id])
    assert node.rejected("facts_mismatch") == 1
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]] == [b"facts_mismatch"]
    node.service.close()
    assert bus.committed[("swarm", (TOPICS.swarm_rollouts, 0))] == 3


@pytest.mark.parametrize(
    ("identity", "said"),
    [
        ({"MODE": "strict"}, "set IDENTITY__TRUST_FILE"),
        ({"MODE": "strict", "TRUST_FILE": "/no/such/trust.yaml"}, "/no/such/trust.yaml"),
    ],
)
def test_a_sampler_whose_trust_list_is_missing_fails_at_start_before_any_connection(
    identity: dict[str, str], said: str
) -> None:
    """The lease needs a broker (a standby waits for one indefinitely): a trust list read only after it
    left a misconfigured sampler retrying an unreachable cluster instead of saying what to set."""
    variables = {
        "SAPO_SAMPLER_NODE_ID": "node-a",
        "SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",  # nothing listens there
        "SAPO_SAMPLER_HTTP_HOST": "127.0.0.1",
        "SAPO_SAMPLER_HTTP_PORT": "0",
    } | {f"SAPO_SAMPLER_IDENTITY__{k}": v for k, v in identity.items()}
    out = start_service("sampler", variables)
    assert out.returncode == 1, out.stderr
    assert "SAPO_SAMPLER_IDENTITY: " in out.stderr and said in out.stderr
    assert "Traceback" not in out.stderr and "127.0.0.1:1" not in out.stderr  # no client was made
