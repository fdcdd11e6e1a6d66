"""Hostile peers on the swarm topic against a real sampler on the broker: records a plain producer
writes as any client of the swarm topic may, each refused, counted and dead-lettered, and the good
group sent after them still taken."""

from __future__ import annotations

import time

import confluent_kafka
import pytest

from sapo.kafka.chunks import H_CHUNK, H_CHUNK_ID, H_CHUNK_SHA
from sapo.kafka.dlq import H_REASON, H_SERVICE, H_SOURCE, H_TIME
from sapo.sampler.settings import SamplerSettings
from sapo.v1 import batch_pb2
from sapo.wire import H_NODE
from tests.integration.test_sampler import NODE, TopicReader, _in_process_core, _topics
from tests.unit.sampler.builders import encoded, questions, real_group

pytestmark = pytest.mark.integration


def test_forged_chunk_counts_and_node_headers_that_name_nobody_are_dead_lettered_and_good_input_goes_on(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A chunk count of 5,000 digits (int() refuses to read it) stopped the sampler at every start. A
    node header that is no node id (identity off: it names the sender) was counted for that "peer",
    as it came, in the next batch's intake: a few such records made a batch of megabytes."""
    topics = _topics(kafka_bootstrap, topic_prefix)
    records = iter(questions(node_seed=61, count=5))
    # A peer's producer, with a message limit of its own choosing (the broker does not enforce one).
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": "4000000"}
    )

    def send(topic: str, node: str, headers: dict[str, bytes] | None = None) -> str:
        """A group of `node` as its generator writes it, with `headers` put in place of its own."""
        group = real_group(next(records), node)
        value, sent = encoded(group)
        written: dict[str, str | bytes | None] = {**dict(sent), **(headers or {})}
        producer.produce(topic, value, group.group_id.encode(), headers=written)
        return group.group_id

    chunk = {H_CHUNK: b"0/" + b"9" * 5000, H_CHUNK_ID: b"c1", H_CHUNK_SHA: b"00"}
    send(topics.swarm_rollouts, "peer-1", chunk)
    send(topics.swarm_rollouts, "peer-1", {H_NODE: "é".encode() * 300_000})
    send(topics.swarm_rollouts, "peer-1", {H_NODE: "peer-1\u202e".encode()})
    taken = send(topics.swarm_rollouts, "peer-2")
    send(topics.rollouts, NODE)
    assert producer.flush(30) == 0

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
    batches, letters = TopicReader(kafka_bootstrap, topics.batches), TopicReader(kafka_bootstrap, topics.dlq)
    try:
        [batch] = batches.batches(1, timeout_s=20)
        dead = letters.until(3, timeout_s=20)
    finally:
        batches.close()
        letters.close()

    external = [bg.group.group_id for bg in batch.groups if bg.source == batch_pb2.GROUP_SOURCE_EXTERNAL]
    assert external == [taken]
    assert [p.node_id for p in batch.intake] == ["peer-2"]  # only a sender that is a node
    transport, groups = "sapo_sampler_messages_rejected_total", "sapo_sampler_groups_rejected_total"
    assert registry.get_sample_value(transport, {"reason": "bad_chunk_header"}) == 1
    assert registry.get_sample_value(groups, {"reason": "bad_node_id"}) == 2
    swarm = topics.swarm_rollouts
    assert sorted((r.headers[H_SOURCE], r.headers[H_REASON]) for r in dead) == [
        (f"{swarm}/0/0".encode(), b"bad_chunk_header"),
        (f"{swarm}/0/1".encode(), b"bad_node_id"),
        (f"{swarm}/0/2".encode(), b"bad_node_id"),
    ]
    assert all(r.headers[H_SERVICE] == b"sampler" and r.headers[H_TIME].isdigit() for r in dead)
