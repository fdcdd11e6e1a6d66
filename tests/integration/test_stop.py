"""A service stopped (SIGTERM) after its broker went away exits promptly, through its clean stop, well
before Kubernetes' SIGKILL: each real service process runs on a broker of its own, which is killed
once the service runs its loop; the SIGTERM that follows must end the process with status 0 within
`STOP_BOUND_S`. The leases' ttl is long (60 s) so that the waits a stop with the broker gone used to
make (a third of the ttl for the lease's release, 10 s for the final flush) add up to 30 s or more."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sapo.broker import EmbeddedBroker
from sapo.cpugate import ComputeGate
from sapo.kafka import ConsumerLoop, Disposition, KafkaPublisher, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.settings import ConsumerProfile
from sapo.topics import TopicNames, ensure_topics
from tests.conformance.launch import NODE, ROOT, service_env
from tests.integration.generator_helpers import http_get, plan_work, wait_until
from tests.integration.kafka_helpers import consumer, create_topics, fill_partitions

pytestmark = pytest.mark.integration
Popen = subprocess.Popen[bytes]

STOP_BOUND_S = 20.0
"""Generous next to the few seconds a stop now takes with the broker gone (`STOP_BROKER_WAIT_S`, 5 s,
once), clearly below the 30 s and more it took before."""
READY_TIMEOUT_S = 120.0


def _settings(service: str, tmp_path: Path) -> dict[str, str]:
    """The conformance profile's settings but for a long lease ttl and (trainer) a checkpoint
    directory of the test's own."""
    settings: dict[str, str] = {}
    if service != "generator":
        settings |= {"LEASE_TTL_S": "60"}
    if service == "trainer":
        settings |= {"CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    return settings


def _steady(service: str, topics: TopicNames) -> str:
    """What a service logs once it runs its loop: a generator holds work partitions, a sampler its
    input streams', a trainer (its lease held, version 0 announced) has planned its first round."""
    return {
        "generator": f"assigned [('{topics.work}'",
        "sampler": f"assigned [('{topics.swarm_rollouts}'",
        "trainer": "planned rounds",
    }[service]


def _wait_for(marker: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while marker not in log.read_text():
        assert process.poll() is None, f"exited with {process.returncode}:\n{log.read_text()[-3000:]}"
        if time.monotonic() > deadline:
            pytest.fail(f"no {marker!r} within {READY_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _launch(service: str, bootstrap: str, prefix: str, log: Path, settings: dict[str, str]) -> Popen:
    env = service_env(service, bootstrap, prefix, settings)
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{service}.main"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def _exit_after_sigterm(process: Popen, log: Path) -> int:
    """The exit status of a process just sent SIGTERM; a failure if it runs past the bound."""
    try:
        return process.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_BOUND_S} s after SIGTERM:\n{log.read_text()[-3000:]}")


def _held_items(port_file: Path) -> float:
    """`sapo_generator_work_held_items`: set to the items a call is about to sample, just before it."""
    if not port_file.is_file():
        return 0.0
    _, text = http_get(f"http://127.0.0.1:{port_file.read_text()}/metrics")
    values = [ln.split()[-1] for ln in text.splitlines() if ln.startswith("sapo_generator_work_held_items ")]
    return float(values[0]) if values else 0.0


@pytest.mark.parametrize("service", ["generator", "sampler", "trainer"])
def test_a_service_stops_promptly_after_its_broker_is_gone(
    service: str, topic_prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / f"{service}.log"
    topics = TopicNames.for_node(NODE, topic_prefix)
    with EmbeddedBroker() as broker:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, topics.specs(), timeout_s=30)
        process = _launch(service, broker.bootstrap, topic_prefix, log, _settings(service, tmp_path))
        try:
            _wait_for(_steady(service, topics), process, log)
            broker.kill()
            process.send_signal(signal.SIGTERM)
            status = _exit_after_sigterm(process, log)
            assert status == 0, f"exit status {status}:\n{log.read_text()[-3000:]}"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_generator_stopped_mid_call_with_its_broker_gone_exits_without_committing_promptly(
    topic_prefix: str, tmp_path: Path
) -> None:
    """The generator's groups of the call in hand go unacknowledged: it exits with status 1 (a
    `DeliveryError`, as any undelivered flush), its items uncommitted, after `STOP_BROKER_WAIT_S` rather
    than its flush's own 30 s (`FLUSH_TIMEOUT_S`). The test holds the compute gate's only slot so
    that the call waits there while the broker is killed and the generator told to stop."""
    log, gate_dir, port_file = tmp_path / "generator.log", tmp_path / "gate", tmp_path / "port"
    gate_dir.mkdir()
    topics = TopicNames.for_node(NODE, topic_prefix)
    with EmbeddedBroker() as broker:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, topics.specs(), timeout_s=30)
        settings = {
            "COMPUTE_GATE_DIR": str(gate_dir),
            "COMPUTE_GATE_SLOTS": "1",
            "HTTP_PORT_FILE": str(port_file),
        }
        gate = ComputeGate.open(gate_dir, 1)
        process = _launch("generator", broker.bootstrap, topic_prefix, log, settings)
        try:
            _wait_for(_steady("generator", topics), process, log)
            with gate.hold():
                plan_work(broker.bootstrap, topic_prefix, NODE, 0)
                wait_until(lambda: _held_items(port_file) > 0, READY_TIMEOUT_S, "a call waiting on the gate")
                broker.kill()
                process.send_signal(signal.SIGTERM)
            status = _exit_after_sigterm(process, log)
            text = log.read_text()
            assert status == 1, f"exit status {status}:\n{text[-3000:]}"
            assert "groups unacknowledged after the flush" in text, text[-3000:]
        finally:
            gate.close()
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_stopping_loop_closes_without_waiting_out_the_session_for_a_coordinator_that_is_gone(
    topic_prefix: str,
) -> None:
    """A finished record's position is stored, then the broker goes: librdkafka's close waits for the
    group's coordinator to commit it until the session times out (45 s by default, the profile used
    here). A stopping loop asks the coordinator for at most the stop's broker wait, then closes
    without committing: the record is read again after the restart."""
    topic = f"{topic_prefix}.in"
    with EmbeddedBroker() as broker:
        fill_partitions(broker.bootstrap, topic, [[b"v"]])
        stop = StopFlag(broker_wait_s=1.0)
        client = consumer(broker.bootstrap, f"{topic_prefix}.group", ConsumerProfile())
        metrics = TransportMetrics(CollectorRegistry(), "test")
        loop = ConsumerLoop(client, [topic], lambda _: Disposition.DONE, stop=stop, metrics=metrics)
        loop.open()
        wait_until(lambda: loop.step(0.2) or loop.handled > 0, READY_TIMEOUT_S, "the record")
        loop.step(0.2)  # past the store interval: the finished position is handed to librdkafka
        broker.kill()
        stop.set("SIGTERM")
        started = time.monotonic()
        loop.close()
        assert time.monotonic() - started < STOP_BOUND_S


def test_what_a_stopping_loop_s_close_raises_still_reaches_its_caller(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Once stopping, the close runs in a thread of its own (bounded by the stop's broker wait); what it
    raised within that bound (here the revocation's hook, which the close calls) must still reach
    the loop's owner, as a close in its own thread's would, rather than end on that thread's stderr."""
    topic = f"{topic_prefix}.in"
    fill_partitions(kafka_bootstrap, topic, [[b"v"]])

    def revoked(_: object) -> None:
        raise RuntimeError("the revocation hook broke")

    stop = StopFlag(broker_wait_s=30.0)
    client = consumer(kafka_bootstrap, f"{topic_prefix}.group")
    metrics = TransportMetrics(CollectorRegistry(), "test")
    loop = ConsumerLoop(
        client, [topic], lambda _: Disposition.DONE, stop=stop, metrics=metrics, on_revoke=revoked
    )
    loop.open()
    wait_until(lambda: loop.step(0.2) or loop.handled > 0, READY_TIMEOUT_S, "the record")
    stop.set("SIGTERM")
    with pytest.raises(RuntimeError, match="the revocation hook broke"):
        loop.close()


ONE_AT_A_TIME = {"batch.num.messages": "1", "max.in.flight.requests.per.connection": "1", "linger.ms": "0"}
"""A producer whose records are acknowledged one round trip after another: a broker that is up but
slow to acknowledge all of them (about 0.2 ms each on loopback)."""


def test_a_stopping_flush_and_send_wait_on_while_the_broker_keeps_acknowledging(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Seconds of acknowledgements that keep coming, next to a stop's broker wait of 0.3 s: a broker
    that is up, only slow (a big final flush, a batch of many chunks). The bound counts from the
    latest acknowledgement, so everything is delivered rather than left (a generator's whole call, a
    sampler's batch) to be redone after the restart, and no later wait is skipped."""
    topic = f"{topic_prefix}.out"
    create_topics(kafka_bootstrap, topic)
    stop = StopFlag(broker_wait_s=0.3)
    config = {"bootstrap.servers": kafka_bootstrap} | ONE_AT_A_TIME
    publisher = KafkaPublisher(config, max_message_bytes=4096, stop=stop)
    try:
        publisher.send_sync(topic, b"k", b"connected", timeout_s=30.0)
        stop.set("SIGTERM")
        for _ in range(20_000):
            publisher.send(topic, b"k", b"x" * 100)
        started = time.monotonic()
        assert publisher.flush(60.0) == 0
        assert time.monotonic() - started > 1.0  # the premise: far slower than the stop's bound
        started = time.monotonic()
        publisher.send_sync(topic, b"k", bytes(20_000 * 1024), timeout_s=60.0)  # thousands of chunks
        assert time.monotonic() - started > 1.0
    finally:
        publisher.close(0.0)
