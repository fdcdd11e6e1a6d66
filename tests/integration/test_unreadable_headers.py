"""Readers outside the consumer loop meet a record whose header name is not UTF-8 as the loop does: the
sampler's start-up recovery and `sapo inspect` take it for what it is (unreadable, `bad_header`), not
for a record that came without headers."""

from __future__ import annotations

import json

import pytest

from sapo.kafka import KafkaPublisher
from sapo.lifecycle import StopFlag
from sapo.node.recovery import read_history
from sapo.sampler.batch import build_batch
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import batch_pb2, policy_pb2
from sapo.wire import SCHEMA_VERSION, message_headers, now_timestamp
from tests.integration.kafka_helpers import consumer
from tests.integration.raw_producer import produce_raw
from tests.integration.test_inspect import run_inspect
from tests.unit.sampler.builders import scored

pytestmark = pytest.mark.integration
NODE = "node-0"
HOSTILE = (b"\xff\xfe", b"1")
"""A header name that is not UTF-8: the Python client cannot decode it."""


def _batch(sequence: int, peer: str) -> batch_pb2.TrainingBatch:
    groups = [scored("local", NODE), scored("external", peer)]
    return build_batch(NODE, sequence, groups, [], round_=sequence, created_at=now_timestamp())


def _update(version: int) -> policy_pb2.PolicyUpdate:
    return policy_pb2.PolicyUpdate(
        schema_version=SCHEMA_VERSION,
        node_id=NODE,
        version=version,
        manifest_uri=f"file:///c/{version}.json",
        manifest_sha256="0" * 64,
        sequence=version - 1,
    )


def _topics(bootstrap: str, prefix: str) -> TopicNames:
    names = TopicNames.for_node(NODE, prefix=prefix)
    ensure_topics({"bootstrap.servers": bootstrap}, names.specs(), timeout_s=30)
    return names


def test_recovery_counts_an_unreadable_batch_as_undecodable_and_skips_an_unreadable_announcement(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """The trainer's loop refuses such a batch (`bad_header`), so its groups were never trained: they
    used to count as used, and such an announcement moved the sampler's sequence on."""
    names = _topics(kafka_bootstrap, topic_prefix)
    publisher = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    first, refused = _batch(0, "node-1"), _batch(1, "node-2")
    value = first.SerializeToString()
    publisher.send_sync(
        names.batches, first.batch_id.encode(), value, message_headers("TrainingBatch", NODE, value)
    )
    value = _update(1).SerializeToString()
    publisher.send_sync(names.policy, NODE.encode(), value, message_headers("PolicyUpdate", NODE, value))
    publisher.close()
    produce_raw(
        kafka_bootstrap, names.batches, refused.batch_id.encode(), refused.SerializeToString(), [HOSTILE]
    )
    produce_raw(kafka_bootstrap, names.policy, NODE.encode(), _update(9).SerializeToString(), [HOSTILE])

    history = read_history(
        consumer(kafka_bootstrap, f"{topic_prefix}.recovery"),
        names.batches,
        NODE,
        max_bytes=1 << 24,
        idle_s=2.0,
        timeout_s=60,
        stop=StopFlag(),
        beat=lambda: None,
        policy_topic=names.policy,
    )
    assert history is not None
    assert history.batches == 1 and history.next_sequence == 2  # sequence 1 is never used again
    assert set(history.used_group_ids) == {bg.group.group_id for bg in first.groups}
    assert (history.trainer_version, history.trainer_next_sequence) == (1, 1)


def test_inspect_shows_a_record_with_an_unreadable_header_name_as_bad(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    names = _topics(kafka_bootstrap, topic_prefix)
    batch = _batch(0, "node-1")
    headers = [HOSTILE, *((k.encode(), v) for k, v in message_headers("TrainingBatch", NODE, b""))]
    produce_raw(kafka_bootstrap, names.batches, batch.batch_id.encode(), batch.SerializeToString(), headers)
    result = run_inspect(kafka_bootstrap, topic_prefix, f"{NODE}/batches", "--json")
    assert result.returncode == 0, result.stderr
    (entry,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (entry["type"], entry["headers"], entry["round"]) == ("TrainingBatch", {}, None)
    assert entry["error"].startswith("bad_header: a header name is not UTF-8")
