"""Records of every sapo topic decoded into entries: type by header or by topic role, the facts the
filters use, dead-letter headers, and bad payloads shown rather than raised."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sapo.identity import NodeKey
from sapo.identity.announce import add_statement, announcement
from sapo.inspect.decode import message_class, to_entry, topic_role, type_of
from sapo.kafka import DeadLetters, Record, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryPublisher
from sapo.sampler.batch import build_batch
from sapo.v1 import policy_pb2, question_pb2
from sapo.wire import SCHEMA_VERSION, message_headers, now_timestamp
from tests.unit.sampler.builders import encoded, questions, real_group, scored

pytestmark = pytest.mark.unit
MAX = 1 << 20
SWARM = "sapo.swarm.rollouts"


def record(
    topic: str, value: bytes | None, headers: dict[str, bytes] | None = None, key: bytes = b"k"
) -> Record:
    return Record(topic, 0, 7, key, value, headers or {}, timestamp_ms=1_700_000_000_000)


def test_topic_roles() -> None:
    assert topic_role("sapo.swarm.rollouts") == "rollouts"
    assert topic_role("test.x.node.node-0.dlq") == "dlq"


def test_a_rollout_group_with_node_task_round_version_and_summary() -> None:
    group = real_group(questions(1, 1)[0], "node-3", (True, False, False, False), round_=4, policy_version=2)
    value, headers = encoded(group, NodeKey.generate())
    entry = to_entry(record(SWARM, value, dict(headers), group.group_id.encode()), MAX)
    assert (entry.type, entry.node, entry.tasks) == ("RolloutGroup", "node-3", (group.question.task,))
    assert (entry.round, entry.policy_version, entry.error) == (4, 2, "")
    assert (entry.key, entry.size, entry.offset) == (group.group_id, len(value), 7)
    assert entry.summary.startswith("4 completions, reward 0.25, tiny:0: ")
    assert entry.headers["sapo-node-id"] == "node-3"
    assert entry.payload is None
    with_payload = to_entry(record(SWARM, value, dict(headers)), MAX, with_payload=True)
    assert with_payload.payload is not None and with_payload.payload["group_id"] == group.group_id


def test_a_training_batch_names_its_peers_and_tasks() -> None:
    groups = [scored("local", "node-0"), scored("external", "peer-2"), scored("external", "peer-1")]
    batch = build_batch("node-0", 5, groups, [], round_=3, created_at=now_timestamp())
    value = batch.SerializeToString()
    entry = to_entry(
        record("sapo.node.node-0.batches", value, dict(message_headers("TrainingBatch", "node-0", value))),
        MAX,
    )
    assert (entry.type, entry.node, entry.round, entry.policy_version) == ("TrainingBatch", "node-0", 3, 5)
    assert entry.tasks == ("basic_arithmetic",)
    assert entry.summary == "seq 5: 3 groups (1 local, 2 external from peer-1,peer-2), reward 0.50"


def test_a_policy_update_has_a_version_and_no_round() -> None:
    update = policy_pb2.PolicyUpdate(
        schema_version=SCHEMA_VERSION,
        node_id="node-0",
        version=7,
        manifest_uri="file:///ckpt/7/manifest.json",
        manifest_sha256="0" * 64,
        batch_id="node-0/6",
        metrics=policy_pb2.StepMetrics(reward_mean=0.25, loss=0.5),
    )
    entry = to_entry(record("sapo.node.node-0.policy", update.SerializeToString()), MAX)
    assert (entry.type, entry.node, entry.policy_version, entry.round) == ("PolicyUpdate", "node-0", 7, None)
    assert entry.summary == "v7 from node-0/6: reward 0.25, loss 0.5000"


def test_a_key_announcement_names_its_node_and_key() -> None:
    key = NodeKey.generate()
    value = announcement(add_statement("node-4", key.public, 1000.0), [key])
    entry = to_entry(record("sapo.swarm.keys", value), MAX)
    assert (entry.type, entry.node, entry.error) == ("KeyAnnouncement", "node-4", "")
    assert entry.summary == f"add key {key.key_id}, 1 signature(s)"


def test_without_a_type_header_the_topic_role_decides() -> None:
    group = real_group(questions(2, 1)[0], "node-1")
    entry = to_entry(record("sapo.node.node-1.rollouts", group.SerializeToString()), MAX)
    assert (entry.type, entry.node, entry.error) == ("RolloutGroup", "node-1", "")


def test_the_type_header_names_any_message_of_the_contract() -> None:
    """A topic added later (a node's work topic) is decoded by the type its producer declares."""
    question = question_pb2.Question(task="basic_arithmetic", text="What is 2 + 3?")
    headers = {"sapo-type": b"Question"}
    entry = to_entry(record("sapo.node.node-0.work", question.SerializeToString(), headers), MAX)
    assert (entry.type, entry.error, entry.tasks) == ("Question", "", ())
    assert entry.summary == 'task: "basic_arithmetic" text: "What is 2 + 3?"'
    assert message_class("Question") is question_pb2.Question
    assert message_class("NoSuchThing") is None
    assert message_class("../etc") is None


def test_garbage_is_shown_by_size_and_headers_never_raised() -> None:
    value = b"\xff\xfe\x00 not protobuf \x01"
    headers = {"x-trace": b"abc", "sapo-signature": b"\x00\xff\x10\x80"}
    entry = to_entry(record(SWARM, value, headers), MAX)
    assert entry.type == "RolloutGroup"
    assert entry.error.startswith("undecodable: ")
    assert (entry.size, entry.node, entry.round) == (len(value), "", None)
    assert entry.headers == {"x-trace": "abc", "sapo-signature": "<4 bytes>"}


def test_an_unknown_type_or_topic_is_shown_not_decoded() -> None:
    future = to_entry(record("sapo.node.node-0.work", b"\x08\x01", {"sapo-type": b"FutureThing"}), MAX)
    assert future.type == "FutureThing"
    assert future.error == "unknown_type: the contract has no message for type header 'FutureThing'"
    other = to_entry(record("someone.elses.topic", b"hello"), MAX)
    assert (other.type, other.size) == ("?", 5)
    assert other.error.startswith("unknown_type")


def test_empty_and_oversized_payloads() -> None:
    assert to_entry(record(SWARM, None), MAX).error == "empty_payload"
    group = real_group(questions(1, 1)[0], "node-0")
    assert to_entry(record(SWARM, group.SerializeToString()), 64).error.startswith("oversized: ")


def test_a_dead_letter_carries_its_reason_and_decodes_the_original() -> None:
    bus = MemoryBus()
    dead = DeadLetters(
        MemoryPublisher(bus), "sapo.node.node-0.dlq", "sampler", TransportMetrics(CollectorRegistry(), "t")
    )
    group = real_group(questions(3, 1)[0], "node-2", round_=1)
    value, headers = encoded(group)
    dead.send(Record(SWARM, 0, 41, b"g", value, dict(headers)), "stale", "round 1 < 5")
    dead.send(Record(SWARM, 0, 42, b"x", b"\xff garbage", {}), "undecodable", "Error parsing message")
    stale, garbage = (to_entry(r, MAX) for r in bus.topics["sapo.node.node-0.dlq"])
    assert (stale.type, stale.node, stale.round, stale.error) == ("RolloutGroup", "node-2", 1, "")
    assert (stale.dlq_reason, stale.dlq_detail, stale.dlq_service) == ("stale", "round 1 < 5", "sampler")
    assert stale.dlq_source == f"{SWARM}/0/41"
    # No type header: the type comes from the role of the topic it was rejected from.
    assert type_of(bus.topics["sapo.node.node-0.dlq"][1]) == "RolloutGroup"
    assert (garbage.dlq_reason, garbage.error.split(":")[0]) == ("undecodable", "undecodable")
