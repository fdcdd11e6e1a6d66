"""Helpers for the trainer's integration tests: batches on the broker, policy updates off it, env, waits."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo import wire
from sapo.kafka import Disposition, KafkaPublisher, Record
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import batch_pb2, policy_pb2, question_pb2
from tests.integration.kafka_helpers import make_loop
from tests.unit.trainer import builders as b

NODE = "node-a"
ROOT = Path(__file__).resolve().parents[2]


def node_topics(bootstrap: str, prefix: str) -> TopicNames:
    topics = TopicNames.for_node(NODE, prefix)
    ensure_topics({"bootstrap.servers": bootstrap}, topics.specs(), timeout_s=30)
    return topics


def make_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: Sequence[question_pb2.Question],
    count: int,
) -> list[batch_pb2.TrainingBatch]:
    """`count` batches over the same questions, all sampled by version 0 (so later ones are stale and
    importance-corrected): one local group of right/wrong answers per question, plus one external group."""
    batches = []
    for seq in range(count):
        groups = []
        for question in questions:
            good, bad = b.answers(question)
            local = b.local_group(model, tokenizer, question, [good, bad, good, bad])
            groups.append(b.batch_group(local, [1.0, 0.0, 1.0, 0.0]))
        good, bad = b.answers(questions[0])
        groups.append(b.batch_group(b.external_group(questions[0], [good, bad]), [1.0, 0.0], b.EXTERNAL))
        batches.append(b.training_batch(seq, groups, node_id=NODE))
    return batches


def publish(bootstrap: str, topic: str, batches: Sequence[batch_pb2.TrainingBatch]) -> None:
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap})
    for batch in batches:
        value = batch.SerializeToString()
        headers = wire.message_headers("TrainingBatch", batch.node_id, value)
        publisher.send_sync(topic, batch.batch_id.encode(), value, headers)


def policy_updates(bootstrap: str, topic: str, until_version: int) -> list[policy_pb2.PolicyUpdate]:
    """Every PolicyUpdate on the topic, in order, up to the first one announcing `until_version`."""
    got: list[policy_pb2.PolicyUpdate] = []

    def collect(record: Record) -> Disposition:
        got.append(wire.decode(policy_pb2.PolicyUpdate, record.value, 1 << 20))
        return Disposition.DONE

    loop, _, _ = make_loop(bootstrap, f"{topic}.reader", [topic], collect)
    loop.run(until=lambda: any(u.version == until_version for u in got), idle_timeout_s=20)
    return got


def trainer_env(bootstrap: str, prefix: str, root: Path) -> dict[str, str]:
    """Environment of a `python -m services.trainer.main` subprocess on the embedded broker."""
    return os.environ | {
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "SAPO_TRAINER_NODE_ID": NODE,
        "SAPO_TRAINER_MODEL": "tiny:0",
        "SAPO_TRAINER_PRECISION": "fp32",
        "SAPO_TRAINER_LR": "1e-3",
        "SAPO_TRAINER_CHECKPOINT_ROOT": str(root),
        "SAPO_TRAINER_KEEP_LAST": "100",
        "SAPO_TRAINER_TOPIC_PREFIX": prefix,
        "SAPO_TRAINER_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "SAPO_TRAINER_CONSUMER__SESSION_TIMEOUT_MS": "6000",
        "SAPO_TRAINER_CONSUMER__HEARTBEAT_INTERVAL_MS": "1000",
        "SAPO_TRAINER_CONSUMER__FETCH_WAIT_MAX_MS": "50",
        "SAPO_TRAINER_HTTP_HOST": "127.0.0.1",
        "SAPO_TRAINER_HTTP_PORT": "0",
        "SAPO_TRAINER_LOG_FORMAT": "text",
        # A SIGKILLed trainer's lease is taken over once it expires: keep the restart tests short.
        "SAPO_TRAINER_LEASE_TTL_S": "4",
    }


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
