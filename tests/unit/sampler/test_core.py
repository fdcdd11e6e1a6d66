"""The service core over the in-memory transport: both streams, dead letters, metrics, batches, offsets
committed only after the batch, recovery after a crash, and partitions taken away."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import DeadLetters, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.kafka.records import AssignHook, RevokeHook
from sapo.lifecycle import StopFlag
from sapo.ops import Health
from sapo.topics import TopicNames
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import validate_batch
from services.sampler.core import SamplerCore
from services.sampler.metrics import SamplerMetrics
from services.sampler.recovery import read_history
from services.sampler.settings import SamplerSettings
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

    def __init__(self, bus: MemoryBus, **settings: object) -> None:
        self.bus = bus
        self.settings = SamplerSettings(node_id=NODE, **settings)  # type: ignore[arg-type]
        self.registry = CollectorRegistry()
        self.core = self._build()

    def _build(self) -> SamplerCore:
        stop = StopFlag()
        history = read_history(
            MemoryConsumerClient(self.bus, f"recovery-{id(self)}-{len(self.bus.topics)}"),
            TOPICS.batches,
            NODE,
            max_bytes=1 << 24,
            idle_s=0.0,
            timeout_s=5.0,
            stop=stop,
            beat=lambda: None,
        )
        assert history is not None
        self.registry = CollectorRegistry()
        transport = TransportMetrics(self.registry, "sampler")
        publisher = MemoryPublisher(self.bus)
        self.swarm_client = LosableClient(self.bus, "swarm")
        core = SamplerCore(
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
        )
        core.local.open()
        core.swarm.open()
        return core

    def restart(self) -> None:
        """The old core is dropped without close(): a SIGKILL, nothing more is committed."""
        self.core = self._build()

    def drain(self) -> None:
        while self.core.step():
            pass
        self.core.step()

    def batches(self) -> list[batch_pb2.TrainingBatch]:
        out = []
        for value in self.bus.values(TOPICS.batches):
            batch = batch_pb2.TrainingBatch()
            batch.ParseFromString(value)
            out.append(batch)
        return out

    def rejected(self, reason: str) -> float:
        return self.registry.get_sample_value("sapo_sampler_groups_rejected_total", {"reason": reason}) or 0.0


def publish(bus: MemoryBus, topic: str, group: rollout_pb2.RolloutGroup) -> None:
    value, headers = encoded(group)
    bus.append(topic, group.group_id.encode(), value, headers)


def _record_cycle() -> itertools.cycle[int]:
    return itertools.cycle(range(len(RECORDS)))


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


def test_offsets_are_committed_only_after_the_batch_is_acknowledged() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=1)
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE))
    node.drain()
    node.core.local.commit()
    assert bus.committed[("local", (TOPICS.rollouts, 0))] == 0  # pooled, not in a batch yet
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[1], "peer-1"))
    node.drain()
    assert len(node.batches()) == 1
    node.core.close()
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


@pytest.mark.parametrize(("keep", "local_groups"), [(False, 1), (True, 2)])
def test_the_reference_baseline_trains_on_own_zero_advantage_groups(keep: bool, local_groups: int) -> None:
    bus = MemoryBus()
    node = Node(
        bus,
        questions_per_round=2,
        local_groups=2,
        external_groups=1,
        expected_peers=1,
        keep_local_zero_advantage=keep,
    )
    publish(bus, TOPICS.rollouts, real_group(RECORDS[0], NODE, (True, True), round_=0))  # no signal
    publish(bus, TOPICS.rollouts, real_group(RECORDS[1], NODE, (True, False), round_=0))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[6], "peer-1", (False, False), round_=0))
    publish(bus, TOPICS.swarm_rollouts, real_group(RECORDS[7], "peer-1", (True, False), round_=0))
    node.drain()
    (batch,) = node.batches()
    local = [bg for bg in batch.groups if bg.source == batch_pb2.GROUP_SOURCE_LOCAL]
    external = [bg for bg in batch.groups if bg.source == batch_pb2.GROUP_SOURCE_EXTERNAL]
    assert (len(local), len(external)) == (local_groups, 1)
    assert validate_batch(batch) is None
    assert node.rejected("no_signal") == 2 - local_groups + 1  # the swarm's is always filtered


def test_lost_partitions_drop_their_pool_and_their_groups_are_accepted_again() -> None:
    bus = MemoryBus()
    node = Node(bus, round_mode="async", local_groups=1, external_groups=1)
    group = real_group(RECORDS[0], "peer-1")
    publish(bus, TOPICS.swarm_rollouts, group)
    node.drain()
    assert node.core.assembler.pool.count("external") == 1
    node.swarm_client.lose()
    assert node.core.assembler.pool.count("external") == 0
    assert group.group_id not in node.core.screen.seen


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
    node.core.close()
    assert bus.committed[("swarm", (TOPICS.swarm_rollouts, 0))] == 5  # rejected picks finished too
