"""The transport against the real broker: swarm fan-out, header filters, dead letters, re-delivery."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from pydantic_settings import SettingsConfigDict

from sapo import wire
from sapo.kafka import Disposition, KafkaPublisher, Record
from sapo.ops import Health, OpsServer
from sapo.runtime import Runtime, start_runtime
from sapo.settings import ConfigError, ServiceSettings, load_settings
from sapo.v1 import rollout_pb2
from tests.factories import make_group
from tests.integration.kafka_helpers import consumer, create_topics, make_loop, read_topic

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _publish_group(pub: KafkaPublisher, topic: str, group: rollout_pb2.RolloutGroup) -> None:
    value = group.SerializeToString()
    pub.send_sync(topic, group.group_id.encode(), value, wire.rollout_headers(group, value))


def _own_node_filter(node: str):  # type: ignore[no-untyped-def]
    def prefilter(record: Record) -> str | None:
        return "own_node" if wire.header_str(record.headers, wire.H_NODE) == node else None

    return prefilter


def test_swarm_group_reaches_two_nodes_and_each_drops_its_own(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    swarm = f"{topic_prefix}.swarm.rollouts"
    create_topics(kafka_bootstrap, swarm)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    from_a, from_b = make_group(node_id="node-a"), make_group(node_id="node-b")
    _publish_group(pub, swarm, from_a)
    _publish_group(pub, swarm, from_b)
    # node-c's own message is not even valid protobuf: only a header-only filter survives it.
    pub.send_sync(swarm, b"k", b"\xff\xff", wire.message_headers("RolloutGroup", "node-c", b""))
    _publish_group(pub, swarm, make_group(node_id="node-c"))

    received: dict[str, list[str]] = {}
    for node in ("node-a", "node-c"):
        got = received.setdefault(node, [])

        def handle(record: Record, got: list[str] = got) -> Disposition:
            got.append(wire.decode(rollout_pb2.RolloutGroup, record.value, 1 << 20).node_id)
            return Disposition.DONE

        loop, registry, _ = make_loop(
            kafka_bootstrap, f"{topic_prefix}.{node}", [swarm], handle, prefilter=_own_node_filter(node)
        )
        loop.run(max_records=4, idle_timeout_s=20)
        assert registry.get_sample_value("sapo_test_messages_rejected_total", {"reason": "own_node"}) == (
            1 if node == "node-a" else 2
        )
    assert received == {"node-a": ["node-b", "node-c"], "node-c": ["node-a", "node-b"]}


def test_malformed_payload_is_dead_lettered_counted_and_consumption_goes_on(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic, dlq = f"{topic_prefix}.in", f"{topic_prefix}.dlq"
    create_topics(kafka_bootstrap, topic, dlq)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    good_before, good_after = make_group(), make_group()
    _publish_group(pub, topic, good_before)
    pub.send_sync(topic, b"bad-key", b"\x08\x96\x01\xff\xff", [("sapo-node-id", b"node-x")])
    _publish_group(pub, topic, good_after)

    handled: list[str] = []

    def handle(record: Record) -> Disposition:
        group = wire.decode(rollout_pb2.RolloutGroup, record.value, 1 << 20)
        handled.append(group.group_id)
        return Disposition.DONE

    loop, registry, loop_pub = make_loop(kafka_bootstrap, f"{topic_prefix}.g", [topic], handle, dlq_topic=dlq)
    server = OpsServer(registry, Health(), host="127.0.0.1", port=0).start()
    try:
        loop.run(max_records=3, idle_timeout_s=20)
        loop_pub.flush(10)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            metrics_text = resp.read().decode()
    finally:
        server.stop()
    assert handled == [good_before.group_id, good_after.group_id]
    assert 'sapo_test_messages_dead_lettered_total{reason="undecodable"} 1.0' in metrics_text

    dead: list[Record] = []

    def collect(record: Record) -> Disposition:
        dead.append(record)
        return Disposition.DONE

    dlq_loop, _, _ = make_loop(kafka_bootstrap, f"{topic_prefix}.ops", [dlq], collect)
    dlq_loop.run(max_records=1, idle_timeout_s=20)
    assert dead[0].value == b"\x08\x96\x01\xff\xff"
    assert dead[0].key == b"bad-key"
    assert dead[0].headers["sapo-dlq-reason"] == b"undecodable"
    assert dead[0].headers["sapo-node-id"] == b"node-x"
    assert dead[0].headers["sapo-dlq-source"].decode().startswith(f"{topic}/0/")


def test_consumer_killed_before_commit_redelivers_and_idempotency_absorbs_it(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topic = f"{topic_prefix}.in"
    create_topics(kafka_bootstrap, topic)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    groups = [make_group() for _ in range(4)]
    for g in groups:
        _publish_group(pub, topic, g)

    sink = tmp_path / "sink.jsonl"
    cmd = [sys.executable, "-m", "tests.integration.idempotent_consumer", kafka_bootstrap, topic, str(sink)]
    expected = str(len(groups))
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    first = subprocess.run([*cmd, "2", expected], env=env, cwd=ROOT, timeout=120, check=False)
    assert first.returncode == -9, "the consumer should have been SIGKILLed mid-stream"
    second = subprocess.run([*cmd, "-1", expected], env=env, cwd=ROOT, timeout=120, check=True)
    assert second.returncode == 0

    deliveries = [json.loads(line) for line in sink.read_text().splitlines()]
    delivered_ids = [d["group_id"] for d in deliveries]
    # The third group was processed, then the process died before its offset was stored: it comes again.
    assert delivered_ids.count(groups[2].group_id) == 2
    applied = [d["group_id"] for d in deliveries if d["applied"]]
    assert applied == [g.group_id for g in groups]


def test_offset_bounds_answer_for_known_partitions_and_leave_unknown_ones_out(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """What the trainer checks its stored offsets against at start (sapo.node.trainer): one record per
    produce request, as batches are sent, so the embedded broker's end offset is exact too."""
    topic = f"{topic_prefix}.batches"
    create_topics(kafka_bootstrap, topic)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    for i in range(3):
        pub.send_sync(topic, b"k", b"%d" % i)
    client = consumer(kafka_bootstrap, f"{topic_prefix}.bounds")  # never subscribed: no group join
    try:
        bounds = client.offset_bounds([(topic, 0), (f"{topic_prefix}.absent", 0)], timeout_s=10)
    finally:
        client.close()
    assert bounds == {(topic, 0): (0, 3)}


def test_a_closed_publisher_delivered_what_it_could_and_counts_what_it_dropped(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.close"
    create_topics(kafka_bootstrap, topic)
    publisher = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    publisher.send(topic, b"k", b"queued")
    assert publisher.close(timeout_s=30) == 0
    assert [r.value for r in read_topic(kafka_bootstrap, topic)] == [b"queued"]
    with pytest.raises(RuntimeError):
        publisher.send(topic, b"k", b"after close")

    nowhere = KafkaPublisher({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": "600000"})
    nowhere.send(topic, b"k", b"never delivered")
    assert nowhere.close(timeout_s=0.5) == 1
    assert nowhere.errors == 1  # the purge's delivery report


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="SAPO_DEMO_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )


def _kafka_client_threads() -> int:
    """librdkafka's threads in this process (named rdk:*): a client not closed keeps them."""
    return sum((task / "comm").read_text().startswith("rdk:") for task in Path("/proc/self/task").iterdir())


def test_an_ops_port_in_use_fails_the_start_with_the_kafka_clients_closed(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producers open before the ops server (a refused client setting ends the start first); a port
    that cannot be taken used to leave them connected, reconnecting for as long as the process lived."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    gc.collect()  # clients earlier tests left to the collector
    before = _kafka_client_threads()
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            monkeypatch.setenv("SAPO_DEMO_HTTP_HOST", "127.0.0.1")
            monkeypatch.setenv("SAPO_DEMO_HTTP_PORT", str(taken.getsockname()[1]))
            with pytest.raises(ConfigError, match="HTTP_PORT") as error:
                start_runtime("demo", load_settings(DemoSettings), install_signals=False)
            # The failed start's frames (and so its clients, were they open) live on in the traceback.
            assert error.tb is not None and _kafka_client_threads() <= before
    finally:
        root.handlers[:], root.level = handlers, level  # keep pytest's log capture


def test_a_consumer_exports_no_brokers_up_series_before_its_first_statistics(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A series created at 0 with the client would read as an outage until the first statistics, and
    for ever with statistics off (CONSUMER__STATISTICS_INTERVAL_MS=0)."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SAPO_DEMO_HTTP_HOST", "127.0.0.1")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PORT", "0")
    monkeypatch.setenv("SAPO_DEMO_CONSUMER__STATISTICS_INTERVAL_MS", "0")
    runtime = start_runtime("demo", load_settings(DemoSettings), install_signals=False)
    try:
        client = runtime.consumer("demo")
        try:
            assert "sapo_demo_kafka_brokers_up{" not in generate_latest(runtime.registry).decode()
        finally:
            client.close()
    finally:
        runtime.close()


def test_the_swarm_consumers_count_under_the_node_connection_without_a_separate_swarm_cluster(
    kafka_bootstrap: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """connection="swarm" names a separate swarm cluster: without one, a swarm consumer reaches the
    node's brokers, and a series of its own would page twice for one outage."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SAPO_DEMO_HTTP_HOST", "127.0.0.1")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PORT", "0")
    monkeypatch.setenv("SAPO_DEMO_CONSUMER__STATISTICS_INTERVAL_MS", "100")
    topic = f"{topic_prefix}.swarm"
    create_topics(kafka_bootstrap, topic)
    runtime = start_runtime("demo", load_settings(DemoSettings), install_signals=False)
    try:
        client = runtime.consumer("demo-swarm", swarm=True, per_process=True)
        try:
            client.subscribe([topic], lambda tps: {}, lambda tps: None, lambda tps: None)
            deadline = time.monotonic() + 30
            while "sapo_demo_kafka_brokers_up{" not in scraped(runtime) and time.monotonic() < deadline:
                client.poll(0.1)
            assert 'sapo_demo_kafka_brokers_up{connection="node"}' in scraped(runtime)
            assert 'connection="swarm"' not in scraped(runtime)
        finally:
            client.close()
    finally:
        runtime.close()


def scraped(runtime: Runtime) -> str:
    return generate_latest(runtime.registry).decode()
