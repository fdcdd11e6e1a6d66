"""Hostile peers on the swarm topic against a real sampler on the broker: records a plain producer
writes as any client of the swarm topic may, each refused, counted and dead-lettered, and the good
group sent after or around them still taken."""

from __future__ import annotations

import time

import confluent_kafka
import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import Record
from sapo.kafka.chunks import H_CHUNK, H_CHUNK_DIGESTS, H_CHUNK_ID, H_CHUNK_SHA, split
from sapo.kafka.dlq import H_REASON, H_SERVICE, H_SOURCE, H_TIME
from sapo.sampler.settings import SamplerSettings
from sapo.topics import TopicNames
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import H_NODE
from tests.integration.test_sampler import NODE, TopicReader, _in_process_core, _topics
from tests.unit.sampler.builders import encoded, questions, real_group

pytestmark = pytest.mark.integration


def _first_batch(
    kafka_bootstrap: str, topic_prefix: str, topics: TopicNames, letters: int, wait_s: float
) -> tuple[batch_pb2.TrainingBatch, list[Record], CollectorRegistry]:
    """A real sampler (async, batches of one local and one external group, one group a peer) run until
    its first batch: that batch, the dead letters of `letters` keys (or those that came within
    `wait_s`) and the sampler's metrics."""
    settings = SamplerSettings(
        node_id=NODE,
        topic_prefix=topic_prefix,
        round_mode="async",
        local_groups=1,
        external_groups=1,
        expected_peers=1,
        max_per_source=1,
        recovery_idle_s=1.0,
    )
    core, registry, health, publisher = _in_process_core(kafka_bootstrap, topics, settings)
    try:
        core.local.open()
        core.swarm.open()
        deadline = time.monotonic() + 40
        while core.sequence < 1 and time.monotonic() < deadline:
            core.step()
        assert health.failing() == []
        assert publisher.flush(10) == 0
    finally:
        core.close()
    batches, dlq = TopicReader(kafka_bootstrap, topics.batches), TopicReader(kafka_bootstrap, topics.dlq)
    try:
        [batch] = batches.batches(1, timeout_s=20)
        return batch, dlq.until(letters, timeout_s=wait_s), registry
    finally:
        batches.close()
        dlq.close()


def test_hostile_records_are_dead_lettered_and_the_good_group_after_them_is_taken(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A chunk count of 5,000 digits (int() refuses to read it) stopped the sampler at every start. A
    node header that is no node id (identity off: it names the sender) was counted for that "peer",
    as it came, in the next batch's intake: a few such records made a batch of megabytes. A copy of a
    group under another spelling of its UUID passed the dedupe by id into the same batch."""
    topics = _topics(kafka_bootstrap, topic_prefix)
    records = iter(questions(node_seed=61, count=5))
    # A peer's producer, with a message limit of its own choosing (the broker does not enforce one).
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": "4000000"}
    )

    def send(topic: str, group: rollout_pb2.RolloutGroup, headers: dict[str, bytes] | None = None) -> None:
        """`group` as its generator writes it, with `headers` put in place of its own."""
        value, sent = encoded(group)
        written: dict[str, str | bytes | None] = {**dict(sent), **(headers or {})}
        producer.produce(topic, value, group.group_id.encode(), headers=written)

    def respelled(group: rollout_pb2.RolloutGroup, group_id: str) -> rollout_pb2.RolloutGroup:
        copy = rollout_pb2.RolloutGroup()
        copy.CopyFrom(group)
        copy.group_id = group_id
        return copy

    chunk = {H_CHUNK: b"0/" + b"9" * 5000, H_CHUNK_ID: b"c1", H_CHUNK_SHA: b"00"}
    send(topics.swarm_rollouts, real_group(next(records), "peer-1"), chunk)
    send(topics.swarm_rollouts, real_group(next(records), "peer-1"), {H_NODE: "é".encode() * 300_000})
    send(topics.swarm_rollouts, real_group(next(records), "peer-1"), {H_NODE: "peer-1\u202e".encode()})
    taken = real_group(next(records), "peer-2")
    for group_id in (taken.group_id, taken.group_id.upper(), "-" * 300_000 + taken.group_id):
        send(topics.swarm_rollouts, respelled(taken, group_id))
    send(topics.rollouts, real_group(next(records), NODE))
    assert producer.flush(30) == 0

    batch, dead, registry = _first_batch(kafka_bootstrap, topic_prefix, topics, letters=5, wait_s=20)

    external = [bg.group.group_id for bg in batch.groups if bg.source == batch_pb2.GROUP_SOURCE_EXTERNAL]
    assert external == [taken.group_id]
    assert [p.node_id for p in batch.intake] == ["peer-2"]  # only a sender that is a node
    transport, groups = "sapo_sampler_messages_rejected_total", "sapo_sampler_groups_rejected_total"
    assert registry.get_sample_value(transport, {"reason": "bad_chunk_header"}) == 1
    assert registry.get_sample_value(groups, {"reason": "bad_node_id"}) == 2
    assert registry.get_sample_value(groups, {"reason": "bad_group_id"}) == 2
    swarm = topics.swarm_rollouts
    assert sorted((r.headers[H_SOURCE], r.headers[H_REASON]) for r in dead) == [
        (f"{swarm}/0/0".encode(), b"bad_chunk_header"),
        (f"{swarm}/0/1".encode(), b"bad_node_id"),
        (f"{swarm}/0/2".encode(), b"bad_node_id"),
        (f"{swarm}/0/4".encode(), b"bad_group_id"),
        (f"{swarm}/0/5".encode(), b"bad_group_id"),
    ]
    assert all(r.headers[H_SERVICE] == b"sampler" and r.headers[H_TIME].isdigit() for r in dead)


def test_a_forged_chunk_under_an_open_group_s_id_is_refused_alone_and_the_group_taken(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A group in chunks, and between its chunks a peer's chunk under its chunk id (public once the
    first chunk is on the topic): the forged chunk dropped the group in flight. It is refused alone
    against the digests the first chunk pinned, and the group completes with its real chunk."""
    topics = _topics(kafka_bootstrap, topic_prefix)
    records = iter(questions(node_seed=62, count=2))
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
    taken = real_group(next(records), "peer-2")
    value, headers = encoded(taken)
    pieces = split(value, headers, -(-len(value) // 3))
    assert len(pieces) == 3 and H_CHUNK_DIGESTS in dict(pieces[0][1])
    forged = (b"\0" * len(pieces[2][0]), pieces[2][1])

    def send(topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        written: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(topic, value, key, headers=written)

    for piece, piece_headers in [*pieces[:2], forged, pieces[2]]:
        send(topics.swarm_rollouts, taken.group_id.encode(), piece, piece_headers)
    send(topics.rollouts, b"local", *encoded(real_group(next(records), NODE)))
    assert producer.flush(30) == 0

    # whatever was dead-lettered (one key: the group's)
    batch, dead, registry = _first_batch(kafka_bootstrap, topic_prefix, topics, letters=2, wait_s=5)

    external = [bg.group.group_id for bg in batch.groups if bg.source == batch_pb2.GROUP_SOURCE_EXTERNAL]
    assert external == [taken.group_id]
    assert registry.get_sample_value("sapo_sampler_messages_rejected_total", {"reason": "forged_chunk"}) == 1
    swarm = topics.swarm_rollouts
    assert [(r.headers[H_SOURCE], r.headers[H_REASON]) for r in dead] == [
        (f"{swarm}/0/2".encode(), b"forged_chunk")
    ]
