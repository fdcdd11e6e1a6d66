"""The embedded broker, topic creation and the `sapo broker` / `sapo topics` commands on a broker."""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    ConfigResource,
    ResourceType,
)

from sapo.broker import BrokerError, EmbeddedBroker, probe_cluster_id
from sapo.cli import main
from sapo.topics import TopicNames, ensure_topics

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_broker_starts_fast_and_answers_with_its_cluster_id() -> None:
    started = time.monotonic()
    with EmbeddedBroker() as broker:
        assert time.monotonic() - started < 5.0
        assert broker.is_running()
        assert broker.bootstrap.startswith("127.0.0.1:")
        assert probe_cluster_id(broker.bootstrap, timeout_s=5.0) == broker.cluster_id


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


def test_stop_is_fast_idempotent_and_frees_the_port() -> None:
    broker = EmbeddedBroker().start()
    bootstrap, log_path = broker.bootstrap, broker.log_path
    assert log_path is not None and log_path.exists()
    started = time.monotonic()
    broker.stop()
    assert time.monotonic() - started < 2.0
    assert not broker.is_running()
    assert not log_path.exists()
    assert probe_cluster_id(bootstrap, timeout_s=1.0) is None
    broker.stop()
    with pytest.raises(BrokerError, match="not running"):
        _ = broker.bootstrap


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
