"""`sapo inspect` as a process against the real broker: every topic of a node decoded as a table and as
JSON lines, the filters, dead letters by reason, summaries, last N, from the end and following,
garbage shown rather than fatal, no consumer group left behind, and clear connection failures that
never echo a secret."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from sapo.kafka import DeadLetters, KafkaPublisher, Record, TransportMetrics
from sapo.sampler.batch import build_batch
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import policy_pb2, question_pb2, rollout_pb2
from sapo.wire import SCHEMA_VERSION, message_headers, now_timestamp
from tests.integration.kafka_helpers import consumer
from tests.unit.sampler.builders import encoded, questions, real_group, scored

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NODES = ("node-0", "node-1", "node-2")
GARBAGE = b"\xff\xfe\x00 not protobuf at all \x01"


def _command(bootstrap: str, prefix: str, argv: tuple[str, ...]) -> list[str]:
    base = [sys.executable, "-m", "sapo.cli", "inspect", "--bootstrap", bootstrap, "--prefix", prefix]
    return [*base, "--idle", "1", *argv]


def _environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "240"} | (extra or {})


def run_inspect(
    bootstrap: str, prefix: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = _command(bootstrap, prefix, argv)
    return subprocess.run(
        cmd, check=False, env=_environ(env), cwd=ROOT, capture_output=True, text=True, timeout=90
    )


def start_inspect(bootstrap: str, prefix: str, *argv: str) -> subprocess.Popen[str]:
    cmd = _command(bootstrap, prefix, argv)
    return subprocess.Popen(
        cmd, env=_environ(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def json_lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@dataclass
class Swarm:
    """What was produced, to compare the tool's output with."""

    names: TopicNames
    work: str
    groups: list[rollout_pb2.RolloutGroup] = field(default_factory=list)


@pytest.fixture
def swarm(kafka_bootstrap: str, topic_prefix: str) -> Swarm:
    """Six real groups of three nodes on the swarm topic and a garbage record; node-0's batch, policy
    update, three dead letters (made by the services' DeadLetters) and two records on a work topic."""
    names = TopicNames.for_node("node-0", prefix=topic_prefix)
    work = names.work
    # One work partition keeps the two records in the order the test reads them.
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, names.specs(work_partitions=1), timeout_s=30)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    made = Swarm(names, work)
    for i, record in enumerate(questions(node_seed=11, count=6)):
        group = real_group(record, NODES[i % 3], round_=i // 2, policy_version=i // 2)
        made.groups.append(group)
        pub.send_sync(names.swarm_rollouts, group.group_id.encode(), *encoded(group))
    pub.send_sync(names.swarm_rollouts, b"junk", GARBAGE, [("x-trace", b"t-1")])

    batch = build_batch("node-0", 0, [scored("local", "node-0"), scored("external", "node-1")], [], round_=0,
                        created_at=now_timestamp())  # fmt: skip
    value = batch.SerializeToString()
    pub.send_sync(
        names.batches, batch.batch_id.encode(), value, message_headers("TrainingBatch", "node-0", value)
    )
    update = policy_pb2.PolicyUpdate(
        schema_version=SCHEMA_VERSION, node_id="node-0", version=1, manifest_uri="file:///c/1.json",
        manifest_sha256="0" * 64, batch_id=batch.batch_id, metrics=policy_pb2.StepMetrics(reward_mean=0.5),
    )  # fmt: skip
    value = update.SerializeToString()
    pub.send_sync(names.policy, b"node-0", value, message_headers("PolicyUpdate", "node-0", value))

    dead = DeadLetters(pub, names.dlq, "sampler", TransportMetrics(CollectorRegistry(), "test"))
    source = names.swarm_rollouts
    dead.send(Record(source, 0, 2, b"a", *_with_headers(made.groups[2])), "stale", "round 0 < 3")
    dead.send(Record(source, 0, 6, b"junk", GARBAGE, {}), "undecodable", "Error parsing message")
    dead.send(Record(source, 0, 4, b"b", *_with_headers(made.groups[4])), "bad_signature", "key unknown")

    question = question_pb2.Question(task="basic_arithmetic", text="What is 2 + 3?").SerializeToString()
    pub.send_sync(work, b"q", question, [("sapo-type", b"Question")])
    pub.send_sync(
        work, b"f", b"\x08\x01\x10\x02", [("sapo-type", b"FutureThing"), ("sapo-node-id", b"node-0")]
    )
    assert pub.flush(10) == 0
    return made


def _with_headers(group: rollout_pb2.RolloutGroup) -> tuple[bytes, dict[str, bytes]]:
    value, headers = encoded(group)
    return value, dict(headers)


def test_json_lines_decode_every_topic_and_show_garbage(
    kafka_bootstrap: str, topic_prefix: str, swarm: Swarm
) -> None:
    entries = json_lines(run_inspect(kafka_bootstrap, topic_prefix, "all", "--json"))
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_topic.setdefault(entry["topic"], []).append(entry)
    names = swarm.names
    assert {t: len(v) for t, v in by_topic.items()} == {
        names.swarm_rollouts: 7,
        names.batches: 1,
        names.policy: 1,
        names.dlq: 3,
        swarm.work: 2,
    }
    groups = [e for e in by_topic[names.swarm_rollouts] if not e["error"]]
    assert [(e["key"], e["node"], e["tasks"], e["round"], e["policy_version"]) for e in groups] == [
        (g.group_id, g.node_id, [g.question.task], g.round, g.policy_version) for g in swarm.groups
    ]
    garbage = by_topic[names.swarm_rollouts][-1]
    assert (garbage["type"], garbage["size"], garbage["headers"]) == (
        "RolloutGroup",
        len(GARBAGE),
        {"x-trace": "t-1"},
    )
    assert garbage["error"].startswith("undecodable: ")
    (batch,) = by_topic[names.batches]
    assert (batch["type"], batch["node"], batch["round"], batch["policy_version"]) == (
        "TrainingBatch",
        "node-0",
        0,
        0,
    )
    assert batch["summary"].startswith("seq 0: 2 groups (1 local, 1 external from node-1)")
    (update,) = by_topic[names.policy]
    assert (update["type"], update["policy_version"], update["round"]) == ("PolicyUpdate", 1, None)
    assert [(e["dlq_reason"], e["dlq_service"], e["node"]) for e in by_topic[names.dlq]] == [
        ("stale", "sampler", "node-2"),
        ("undecodable", "sampler", ""),
        ("bad_signature", "sampler", "node-1"),
    ]
    assert by_topic[names.dlq][0]["dlq_source"] == f"{names.swarm_rollouts}/0/2"
    question, future = by_topic[swarm.work]
    assert (question["type"], question["error"]) == ("Question", "")
    assert (future["type"], future["size"], future["node"]) == ("FutureThing", 4, "node-0")
    assert future["error"].startswith("unknown_type")


def test_the_table_shows_one_row_per_message(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> None:
    result = run_inspect(kafka_bootstrap, topic_prefix, "swarm", "node-0/dlq")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["time", "(UTC)", "topic", "p:offset"]
    rows = [line for line in lines[2:] if line.strip()]
    assert len(rows) == 10
    first = rows[0].split()
    group = swarm.groups[0]
    assert first[2:9] == [
        "swarm/rollouts",
        "0:0",
        "RolloutGroup",
        group.node_id,
        group.question.task,
        "0",
        "0",
    ]
    assert "4 completions, reward 0.50, tiny:0" in rows[0]
    assert "undecodable; headers: x-trace=t-1; Error parsing message" in rows[6]
    assert "node-0/dlq" in rows[7]
    assert f"[stale] by sampler from {swarm.names.swarm_rollouts}/0/2: round 0 < 3" in rows[7]
    assert "read 10 records from 2 partitions" in result.stderr


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["--node", "node-1"], lambda g: g.node_id == "node-1"),
        (["--node", "node-0", "--node", "node-2"], lambda g: g.node_id in ("node-0", "node-2")),
        (["--round", "1.."], lambda g: g.round >= 1),
        (
            ["--policy-version", "..1", "--node", "node-2"],
            lambda g: g.policy_version <= 1 and g.node_id == "node-2",
        ),
        (["--task", "basic_arithmetic"], lambda g: g.question.task == "basic_arithmetic"),
    ],
)
def test_filters(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm, argv: list[str], wanted: Any) -> None:
    entries = json_lines(run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json", *argv))
    expected = [g.group_id for g in swarm.groups if wanted(g)]
    assert expected, "the filter must select something for the test to mean anything"
    assert [e["key"] for e in entries] == expected


def test_dead_letters_by_reason(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> None:
    reasons = ["--reason", "stale", "--reason", "bad_signature"]
    entries = json_lines(run_inspect(kafka_bootstrap, topic_prefix, "node-0/dlq", "--json", *reasons))
    assert [(e["dlq_reason"], e["key"]) for e in entries] == [("stale", "a"), ("bad_signature", "b")]
    assert [e["tasks"] for e in entries] == [[swarm.groups[2].question.task], [swarm.groups[4].question.task]]
    table = run_inspect(kafka_bootstrap, topic_prefix, "node-0/dlq", "--reason", "undecodable")
    rows = [line for line in table.stdout.splitlines()[2:] if line.strip()]
    assert len(rows) == 1
    assert "[undecodable] by sampler from " in rows[0] and ": Error parsing message" in rows[0]


def test_last_n_are_the_newest_matching(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> None:
    entries = json_lines(run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json", "--last", "3"))
    assert [e["offset"] for e in entries] == [4, 5, 6]
    entries = json_lines(
        run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json", "--last", "2", "--node", "node-0")
    )
    assert [e["key"] for e in entries] == [swarm.groups[0].group_id, swarm.groups[3].group_id]


def test_since_a_time_skips_older_records(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> None:
    entries = json_lines(run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json"))
    boundary = entries[3]["timestamp_ms"]
    assert entries[2]["timestamp_ms"] < boundary, "send_sync spaces records by at least a round trip"
    since = datetime.fromtimestamp(boundary / 1000, UTC).isoformat(timespec="milliseconds")
    later = json_lines(run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json", "--since", since))
    assert [e["offset"] for e in later] == [3, 4, 5, 6]


def test_summary_counts_rates_and_sizes(kafka_bootstrap: str, topic_prefix: str) -> None:
    """Records with chosen timestamps and sizes: the summary's numbers are computed independently here."""
    names = TopicNames.for_node("node-0", prefix=topic_prefix)
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, names.specs(), timeout_s=30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    start_ms = int(time.time() * 1000) - 60_000
    sizes: dict[str, list[int]] = {"node-0": [], "node-1": []}
    records = questions(node_seed=5, count=9)
    for i, record in enumerate(records):
        node = "node-0" if i < 6 else "node-1"
        value, headers = encoded(real_group(record, node))
        sizes[node].append(len(value))
        wire: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(names.swarm_rollouts, value, b"k", headers=wire, timestamp=start_ms + 250 * i)
    assert producer.flush(10) == 0
    result = run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--summary", "--json")
    (line,) = result.stdout.splitlines()
    summary = json.loads(line)
    assert (summary["messages"], summary["read"], summary["undecodable"]) == (9, 9, 0)
    nodes = {row["node"]: row for row in summary["node"]}
    assert {n: row["messages"] for n, row in nodes.items()} == {"node-0": 6, "node-1": 3}
    assert nodes["node-0"]["rate_per_s"] == pytest.approx(5 / 1.25)  # 6 records over 5 gaps of 0.25 s
    assert nodes["node-1"]["rate_per_s"] == pytest.approx(2 / 0.5)
    for node, row in nodes.items():
        cuts = statistics.quantiles(sizes[node], n=100, method="inclusive")
        assert (row["size_p50"], row["size_p90"], row["size_max"]) == (cuts[49], cuts[89], max(sizes[node]))
        assert row["bytes"] == sum(sizes[node])
    tasks = {row["task"]: row["messages"] for row in summary["task"]}
    assert tasks == {t: sum(1 for r in records if r.task == t) for t in {r.task for r in records}}
    (topic,) = summary["topic"]
    assert topic["rate_per_s"] == pytest.approx(8 / 2.0)
    table = run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--summary")
    assert (
        "by node" in table.stdout
        and "by task" in table.stdout
        and "9 messages, 0 undecodable" in table.stdout
    )


@pytest.fixture
def following(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> Iterator[subprocess.Popen[str]]:
    proc = start_inspect(
        kafka_bootstrap, topic_prefix, "swarm", "--from-end", "--max-messages", "2", "--json"
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_from_the_end_shows_only_new_messages_and_stops_at_the_count(
    kafka_bootstrap: str, topic_prefix: str, swarm: Swarm, following: subprocess.Popen[str]
) -> None:
    assert following.stderr is not None
    for line in following.stderr:  # the reader is assigned once it says where it reads from
        if "reading 1 partition(s) from now, following" in line:
            break
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    new = [real_group(r, "node-9", round_=7) for r in questions(node_seed=99, count=2)]
    for group in new:
        pub.send_sync(swarm.names.swarm_rollouts, group.group_id.encode(), *encoded(group))
    out, err = following.communicate(timeout=30)
    assert following.returncode == 0, err
    assert [json.loads(x)["key"] for x in out.splitlines()] == [g.group_id for g in new]
    assert "7 before the start skipped, 2 matched" in err


def test_follow_is_bounded_by_duration(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> None:
    started = time.monotonic()
    entries = json_lines(
        run_inspect(kafka_bootstrap, topic_prefix, "node-0/policy", "--json", "-f", "--duration", "3")
    )
    assert [e["type"] for e in entries] == ["PolicyUpdate"]
    assert time.monotonic() - started >= 3


def test_ctrl_c_ends_a_follow_with_its_summary(kafka_bootstrap: str, topic_prefix: str, swarm: Swarm) -> None:
    proc = start_inspect(kafka_bootstrap, topic_prefix, "node-0", "--follow", "--summary", "--json")
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "following" in line:
                break
        time.sleep(2)  # read what is there, then idle: following
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert {row["topic"]: row["messages"] for row in summary["topic"]} == {
        swarm.names.batches: 1,
        swarm.names.policy: 1,
        swarm.names.dlq: 3,
        swarm.work: 2,
    }
    assert {row["dlq_reason"]: row["messages"] for row in summary["dlq_reason"]} == {
        "stale": 1,
        "undecodable": 1,
        "bad_signature": 1,
    }
    assert summary["undecodable"] == 2  # the dead-lettered garbage and the unknown type on the work topic


def test_no_consumer_group_is_joined_or_committed(
    kafka_bootstrap: str, topic_prefix: str, swarm: Swarm
) -> None:
    """A service's group with committed offsets is listed by the broker; inspect leaves none of its own
    and does not move the service's."""
    service_group = f"{topic_prefix}.sampler"
    client = consumer(kafka_bootstrap, service_group)
    client.subscribe([swarm.names.swarm_rollouts], lambda _tps: {}, lambda _tps: None, lambda _tps: None)
    deadline = time.monotonic() + 30
    while client.poll(0.2) is None and time.monotonic() < deadline:
        pass
    client.store([(swarm.names.swarm_rollouts, 0, 3)])
    client.commit()
    client.close()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def committed() -> list[tuple[str, int, int]]:
        request = [ConsumerGroupTopicPartitions(service_group)]
        (future,) = admin.list_consumer_group_offsets(request).values()
        return [(tp.topic, tp.partition, tp.offset) for tp in future.result().topic_partitions]

    before = committed()
    json_lines(run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json"))
    json_lines(run_inspect(kafka_bootstrap, topic_prefix, "swarm", "--json", "--last", "2"))
    groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid]
    assert service_group in groups
    assert not [g for g in groups if g.startswith("sapo-inspect")]
    assert committed() == before == [(swarm.names.swarm_rollouts, 0, 3)]


def test_connection_failures_are_clear_and_never_echo_the_password(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    password = f"pw-{uuid.uuid4().hex}"
    env = {"SAPO_INSPECT_KAFKA__SASL_PASSWORD": password, "SAPO_INSPECT_TIMEOUT_S": "3"}
    sasl = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username", "ops"]
    result = run_inspect(kafka_bootstrap, topic_prefix, "swarm", *sasl, env=env)
    assert result.returncode == 1
    assert "check --bootstrap and the security settings" in result.stderr
    misconfigured = run_inspect(
        kafka_bootstrap, topic_prefix, "swarm", "--security-protocol", "SASL_SSL", env=env
    )
    assert misconfigured.returncode == 2
    assert (
        "SAPO_INSPECT_KAFKA: " in misconfigured.stderr and "set KAFKA__SASL_MECHANISM" in misconfigured.stderr
    )
    for output in (result.stdout, result.stderr, misconfigured.stdout, misconfigured.stderr):
        assert password not in output
    missing = run_inspect(kafka_bootstrap, topic_prefix, "node-9/dlq")
    assert (
        missing.returncode == 1
        and f"no such topic(s) at {kafka_bootstrap}: {topic_prefix}.node.node-9.dlq" in missing.stderr
    )
