"""The embedded broker, topic creation and the `sapo broker` / `sapo topics` commands on a broker."""

from __future__ import annotations

import logging
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    ConfigResource,
    ResourceType,
)

from sapo.broker import BrokerError, EmbeddedBroker, probe_cluster_id, storage_env
from sapo.cli import main
from sapo.settings import ConsumerProfile
from sapo.topics import TopicNames, ensure_topics
from tests.integration.kafka_helpers import create_topics, read_topic
from tests.s3 import S3Server

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_broker_starts_and_answers_with_its_cluster_id() -> None:
    with EmbeddedBroker() as broker:
        assert broker.is_running()
        assert broker.bootstrap.startswith("127.0.0.1:")
        assert probe_cluster_id(broker.bootstrap, timeout_s=5.0) == broker.cluster_id


def test_an_ipv6_host_is_bracketed_for_tansu_and_clients() -> None:
    """`--host ::1` used to reach tansu as `tcp://::1:PORT`, which it refuses."""
    with EmbeddedBroker(host="::1") as broker:
        assert broker.bootstrap.startswith("[::1]:")
        create_topics(broker.bootstrap, "v6")
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        producer.produce("v6", b"over ipv6")
        assert producer.flush(10) == 0
        assert [r.value for r in read_topic(broker.bootstrap, "v6", profile=ConsumerProfile.local())] == [
            b"over ipv6"
        ]


def test_two_brokers_get_different_ports_and_cluster_ids() -> None:
    with EmbeddedBroker() as first, EmbeddedBroker() as second:
        assert first.bootstrap != second.bootstrap
        assert first.cluster_id != second.cluster_id
        assert probe_cluster_id(second.bootstrap, timeout_s=5.0) == second.cluster_id


def test_busy_port_fails_clearly_instead_of_reporting_the_old_broker() -> None:
    with EmbeddedBroker() as old:
        port = int(old.bootstrap.rsplit(":", 1)[1])
        newcomer = EmbeddedBroker(port=port, start_timeout_s=10.0)
        with pytest.raises(BrokerError, match="Address in use"):
            newcomer.start()
        assert not newcomer.is_running()
        newcomer.stop()
        assert probe_cluster_id(old.bootstrap, timeout_s=5.0) == old.cluster_id


def test_stop_ends_the_broker_with_sigterm_is_idempotent_and_frees_the_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = EmbeddedBroker(stop_grace_s=60.0).start()  # a slow host, not an ignored SIGTERM
    bootstrap, log_path = broker.bootstrap, broker.log_path
    assert log_path is not None and log_path.exists()
    assert Path(f"/proc/{broker.pid}/comm").read_text().strip() == "tansu"
    with caplog.at_level(logging.WARNING, logger="sapo.broker"):
        broker.stop()
    assert "ignored SIGTERM" not in caplog.text  # it exited on SIGTERM, not killed after the grace period
    assert not broker.is_running()
    assert not log_path.exists()
    assert probe_cluster_id(bootstrap, timeout_s=1.0) is None
    broker.stop()
    with pytest.raises(BrokerError, match="not running"):
        _ = broker.bootstrap
    with pytest.raises(BrokerError, match="not running"):
        _ = broker.pid


def test_ensure_topics_is_idempotent_and_compacts_the_policy_topic(
    kafka_client_config: dict[str, str], topic_prefix: str
) -> None:
    names = TopicNames.for_node("node-0", prefix=topic_prefix)
    specs = names.specs(partitions=2)
    created = ensure_topics(kafka_client_config, specs, timeout_s=15.0)
    assert sorted(created) == sorted(spec.name for spec in specs)
    assert ensure_topics(kafka_client_config, specs, timeout_s=15.0) == []

    admin = AdminClient(dict(kafka_client_config))
    topics = admin.list_topics(timeout=10.0).topics
    assert len(topics[names.rollouts].partitions) == 2
    assert len(topics[names.policy].partitions) == 1
    # tansu (0.6.0) implements DescribeConfigs for topics: it returns the overrides given at creation.
    resources = [
        ConfigResource(ResourceType.TOPIC, names.policy),
        ConfigResource(ResourceType.TOPIC, names.dlq),
    ]
    described = {
        res.name: future.result(timeout=10.0) for res, future in admin.describe_configs(resources).items()
    }
    assert described[names.policy]["cleanup.policy"].value == "compact"
    dlq_policy = described[names.dlq].get("cleanup.policy")
    assert dlq_policy is None or dlq_policy.value == "delete"


def test_sapo_topics_creates_once_then_reports_existing(
    kafka_bootstrap: str, topic_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["topics", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix, "--node", "a", "--node", "b"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()
    assert len(first) == 14  # two shared swarm topics (rollouts, keys) + 6 per node
    assert all(line.startswith("created ") for line in first)
    assert f"created {topic_prefix}.swarm.rollouts" in first

    assert main(argv) == 0
    second = capsys.readouterr().out.splitlines()
    assert second == [line.replace("created ", "exists ", 1) for line in first]


def test_sapo_topics_takes_the_cluster_from_its_environment(
    kafka_bootstrap: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PLAINTEXT, the brokers from SAPO_TOPICS_KAFKA__BOOTSTRAP_SERVERS: no --bootstrap needed."""
    monkeypatch.setenv("SAPO_TOPICS_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SAPO_TOPICS_KAFKA__SECURITY_PROTOCOL", "PLAINTEXT")
    assert main(["topics", "--prefix", topic_prefix, "--node", "a"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"created {topic_prefix}.node.a.rollouts" in lines and len(lines) == 8
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert f"{topic_prefix}.swarm.keys" in admin.list_topics(timeout=10.0).topics


@pytest.mark.parametrize(
    "secured",
    [
        ["--security-protocol", "SSL"],
        ["--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "admin"],
    ],
    ids=["ssl", "sasl_ssl"],
)
def test_a_secured_connection_the_listener_does_not_speak_fails_within_the_timeout(
    kafka_bootstrap: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    secured: list[str],
) -> None:
    """The embedded broker listens in PLAINTEXT only: a TLS client never gets an answer. The command
    ends after --timeout with what to check, the password unprinted, rather than waiting."""
    monkeypatch.setenv("SAPO_TOPICS_KAFKA__SASL_PASSWORD", "s3cret")
    argv = [
        "topics",
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        topic_prefix,
        "--node",
        "a",
        "--timeout",
        "2",
    ]
    started = time.monotonic()
    assert main([*argv, *secured]) == 1
    assert time.monotonic() - started < 10.0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[-1].startswith(f"could not list topics at {kafka_bootstrap} within 2.0 s")
    assert errors[-1].endswith(
        "check that --bootstrap reaches the cluster and that the security settings (--security-protocol, "
        "--sasl-*, --ssl-* or SAPO_TOPICS_KAFKA__*) match its listener"
    )
    assert "s3cret" not in caplog.text


def _read_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """First stdout line of `process`, failing the test instead of hanging if none comes."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            pytest.fail(f"no output within {timeout_s} s")
    return process.stdout.readline().strip()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_sapo_broker_prints_bootstrap_and_exits_zero_on_signal(stop_signal: signal.Signals) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sapo.cli", "broker"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = _read_line(process, timeout_s=30.0)
        assert line.startswith("bootstrap=127.0.0.1:"), line
        bootstrap = line.removeprefix("bootstrap=")
        assert probe_cluster_id(bootstrap, timeout_s=5.0) is not None
        process.send_signal(stop_signal)
        assert process.wait(timeout=10.0) == 0
        assert probe_cluster_id(bootstrap, timeout_s=1.0) is None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _, stderr = process.communicate()
    assert "stopping the broker" in stderr


def test_s3_storage_keeps_every_acknowledged_record_across_a_kill_9(s3_server: S3Server) -> None:
    """Records acknowledged before a SIGKILL and after the restart (same port, same cluster id) are all
    read back; a consumer group's committed offset survives too."""
    storage = f"s3://{s3_server.create_bucket('tansu')}/"
    broker = EmbeddedBroker(storage=storage, env=s3_server.env).start()
    bootstrap, cluster_id = broker.bootstrap, broker.cluster_id
    profile = ConsumerProfile.local_durable()
    try:
        create_topics(bootstrap, "durable")
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i in range(50):
            producer.produce("durable", str(i).encode())
        assert producer.flush(30) == 0
        first = read_topic(bootstrap, "durable", idle_timeout_s=6.0, profile=profile)
        assert [int(r.value or b"") for r in first] == list(range(50))
        broker.kill()
        assert not broker.is_running()
        broker.start()
        assert (broker.bootstrap, broker.cluster_id) == (bootstrap, cluster_id)
        for i in range(50, 80):
            producer.produce("durable", str(i).encode())
        assert producer.flush(30) == 0
        values = sorted(int(r.value or b"") for r in read_topic(bootstrap, "durable", 6.0, profile))
        assert values == list(range(80))
    finally:
        broker.stop()


def test_bad_storage_settings_fail_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    with pytest.raises(ValueError, match="needs AWS_ACCESS_KEY_ID"):
        EmbeddedBroker(storage="s3://bucket/", env={"AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "r"})
    with pytest.raises(ValueError, match="memory:// and s3://"):
        EmbeddedBroker(storage="postgres://db/")
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "r"}
    assert storage_env("s3://b/", env | {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}) == {
        "AWS_ENDPOINT": "http://127.0.0.1:9",
        "AWS_ALLOW_HTTP": "true",
    }
    assert storage_env("s3://b/", env) == {}  # the real S3: tansu's defaults
    assert storage_env("memory://tansu/", {}) == {}
