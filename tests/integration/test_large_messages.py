"""A reasoning-length training batch through the real broker at Kafka's default message limit.

16 groups x 16 completions x 8,192 tokens, each completion with its text, token ids and behaviour
log-probs (about 16 MB encoded), published by the services' producer with the default
`max_message_bytes` (1 MB, Apache Kafka's broker default) and read back by the one consumer loop: the
chunks reassemble into the identical batch, every chunk's offset is committed, nothing is refused.
The slow test hands such a batch to a real trainer (tiny model with a 1,024-token vocabulary: one
step over 2.1 M completion tokens takes minutes on a CPU core), which trains every token, announces
the version and commits past the batch's last chunk.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sapo import wire
from sapo.kafka import Disposition, Record
from sapo.kafka.consumer import DEFAULT_MAX_PAYLOAD_BYTES
from sapo.models import load_model, tokenizer_fingerprint
from sapo.node.trainer import TrainerService
from sapo.runtime import consumer_group, start_runtime
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.topics import DEFAULT_MAX_MESSAGE_BYTES
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2, rollout_pb2
from tests.factories import make_group
from tests.integration import trainer_support as ts
from tests.integration.kafka_helpers import create_topics, make_loop, read_topic
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


@pytest.mark.slow
@pytest.mark.timeout(3600)  # one step over 2.1 M tokens: about 8 minutes on an idle core
def test_a_reasoning_length_batch_is_trained_and_acknowledged(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    model_ref = "tiny-bpe:0"  # the trainer's own tokenizer: local rows are trained on their ids
    _, tokenizer = load_model(model_ref)
    rng = random.Random(1)
    groups = []
    for g, question in enumerate(b.questions(GROUPS)):
        completions = [
            rollout_pb2.Completion(
                text=f"{question.answer}</answer>" if (g + c) % 2 else "no</answer>",
                token_ids=[rng.randrange(tokenizer.vocab_size) for _ in range(TOKENS)],
                logprobs=[-rng.random() * 5 for _ in range(TOKENS)],
                finish_reason=rollout_pb2.FINISH_REASON_LENGTH,
            )
            for c in range(COMPLETIONS)
        ]
        group = rollout_pb2.RolloutGroup(
            schema_version=wire.SCHEMA_VERSION,
            group_id=str(uuid.uuid4()),
            node_id=ts.NODE,
            question=question,
            completions=completions,
            model_id=model_ref,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=TOKENS),
            created_at=wire.now_timestamp(),
            completed_at=wire.now_timestamp(),
            prompt_token_ids=b.prompt_ids(tokenizer, question),
        )
        groups.append(b.batch_group(group, [float((g + c) % 2) for c in range(COMPLETIONS)]))
    batch = b.training_batch(0, groups, node_id=ts.NODE)
    assert len(batch.SerializeToString()) > 8 * DEFAULT_MAX_MESSAGE_BYTES  # ids and log-probs alone: 12 MB
    ts.publish(kafka_bootstrap, topics.batches, [batch])

    longest = max(len(bg.group.prompt_token_ids) for bg in groups) + TOKENS
    settings = TrainerSettings(
        node_id=ts.NODE,
        model=model_ref,
        precision="fp32",
        checkpoint_root=tmp_path,
        max_sequence_tokens=longest,  # nothing is cut: every token of the batch is trained
        micro_batch_tokens=longest,  # one row per forward pass bounds activation memory
        topic_prefix=topic_prefix,
        kafka=KafkaConnection(bootstrap_servers=kafka_bootstrap),
        consumer=ConsumerProfile.local(),
        http_host="127.0.0.1",
        http_port=0,
    )
    runtime = start_runtime("trainer", settings, install_signals=False)
    try:
        service = TrainerService.from_runtime(settings, runtime)
        assert service is not None
        service.run(until=lambda: service.trainer.version >= 1, idle_timeout_s=1800)
        metrics = runtime.registry
    finally:
        runtime.close()

    updates = ts.policy_updates(kafka_bootstrap, topics.policy, until_version=1)
    assert [(u.version, u.batch_id) for u in updates] == [(0, ""), (1, batch.batch_id)]
    step = updates[1].metrics
    assert step.completion_tokens == GROUPS * COMPLETIONS * TOKENS
    assert step.grad_norm > 0
    dead = [
        s
        for m in metrics.collect()
        for s in m.samples
        if "dead_letter" in s.name and s.name.endswith("_total")
    ]
    assert dead and not [s for s in dead if s.value], dead  # nothing dead-lettered
    (record,) = read_topic(kafka_bootstrap, topics.batches)
    last = record.parts[-1]
    trainer_group = consumer_group(topic_prefix, ts.NODE, "trainer")
    assert _committed(kafka_bootstrap, trainer_group, last) == last.offset + 1  # every chunk acknowledged


def _committed(bootstrap: str, group: str, part: Record) -> int:
    check = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (committed,) = check.committed([TopicPartition(part.topic, part.partition)], timeout=30)
    finally:
        check.close()
    return int(committed.offset)
