"""A reasoning-length training batch through the real broker at Kafka's default message limit.

16 groups x 16 completions x 8,192 tokens, each completion with its text, token ids and behaviour
log-probs (about 16 MB encoded), published by the services' producer with the default
`max_message_bytes` (1 MB, Apache Kafka's broker default) and read back by the one consumer loop: the
chunks reassemble into the identical batch, every chunk's offset is committed, nothing is refused.
"""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Consumer, TopicPartition

from sapo import wire
from sapo.kafka import Disposition, Record
from sapo.kafka.consumer import DEFAULT_MAX_PAYLOAD_BYTES
from sapo.topics import DEFAULT_MAX_MESSAGE_BYTES
from sapo.v1 import batch_pb2, rollout_pb2
from tests.factories import make_group
from tests.integration.kafka_helpers import create_topics, make_loop
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.integration

GROUPS, COMPLETIONS, TOKENS = 16, 16, 8192


def reasoning_batch(rng: random.Random) -> batch_pb2.TrainingBatch:
    groups = []
    for g in range(GROUPS):
        group = make_group(node_id="node-a")
        del group.completions[:]
        for _ in range(COMPLETIONS):
            ids = [rng.randrange(49152) for _ in range(TOKENS)]
            group.completions.append(
                rollout_pb2.Completion(
                    text=" ".join(str(i) for i in ids[:1500]),  # ~8k characters of text
                    token_ids=ids,
                    logprobs=[-rng.random() * 5 for _ in range(TOKENS)],
                    finish_reason=rollout_pb2.FINISH_REASON_LENGTH,
                )
            )
        rewards = [float((g + c) % 2) for c in range(COMPLETIONS)]
        groups.append(b.batch_group(group, rewards))
    return b.training_batch(7, groups, node_id="node-a")


def test_a_reasoning_length_batch_travels_chunked_and_commits_every_chunk(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.node.node-a.batches"
    create_topics(kafka_bootstrap, topic)
    batch = reasoning_batch(random.Random(0))
    value = batch.SerializeToString()
    assert len(value) > 12 * DEFAULT_MAX_MESSAGE_BYTES  # about 16 MB: far over the limit every hop keeps

    received: list[Record] = []

    def collect(record: Record) -> Disposition:
        received.append(record)
        return Disposition.DONE

    loop, registry, publisher = make_loop(kafka_bootstrap, f"{topic}.reader", [topic], collect)
    publisher.send_sync(
        topic, batch.batch_id.encode(), value, wire.message_headers("TrainingBatch", "node-a", value)
    )
    loop.run(until=lambda: bool(received), idle_timeout_s=30)
    loop.close()

    assert len(received) == 1
    (record,) = received
    assert wire.decode(batch_pb2.TrainingBatch, record.value, DEFAULT_MAX_PAYLOAD_BYTES) == batch
    chunks = len(record.parts)
    assert chunks > 12
    rejected = [
        s for m in registry.collect() for s in m.samples if s.name.endswith("rejected_total") and s.value
    ]
    assert rejected == []
    # Every chunk's offset is committed: the group's position is past the last chunk.
    last = record.parts[-1]
    check = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}.reader"})
    try:
        (committed,) = check.committed([TopicPartition(topic, last.partition)], timeout=30)
    finally:
        check.close()
    assert committed.offset == last.offset + 1
