"""The sampler against the real broker: a node and three peers publishing real groups, bad input of
every kind (with eager verification, the default, and lazy), then the real service process
SIGKILLed mid-stream and restarted."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sapo import wire
from sapo.cpuslice import DEFAULT_SLICE_MS
from sapo.generator.fingerprint import settings_fingerprint
from sapo.generator.settings import GeneratorSettings
from sapo.identity import NodeKey, TrustMode
from sapo.identity.settings import IdentitySettings
from sapo.identity.trustlist import TrustList, save_trust_list
from sapo.kafka import DeadLetters, KafkaPublisher, Record, TransportMetrics
from sapo.kafka.chunks import chunk_size
from sapo.lifecycle import StopFlag
from sapo.node.metrics import SamplerMetrics
from sapo.node.recovery import read_history
from sapo.node.sampler import SamplerService
from sapo.ops import Health, OpsServer
from sapo.runtime import start_runtime
from sapo.sampler import VerifyMode
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import batch_pb2, rollout_pb2
from tests.integration.kafka_helpers import consumer
from tests.sched import kernel_has_custom_slices, process_slices_ns
from tests.unit.sampler.builders import encoded, questions, real_group

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NODE = "node-0"
PEERS = ("peer-1", "peer-2", "peer-3")


def _topics(bootstrap: str, prefix: str) -> TopicNames:
    topics = TopicNames.for_node(NODE, prefix)
    ensure_topics({"bootstrap.servers": bootstrap}, topics.specs(), timeout_s=30)
    return topics


def _send(pub: KafkaPublisher, topic: str, group: rollout_pb2.RolloutGroup) -> None:
    value, headers = encoded(group)
    pub.send(topic, group.group_id.encode(), value, headers)


class TopicReader:
    """Reads a topic from the beginning in a consumer group of its own."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._client = consumer(bootstrap, f"{topic}.reader")
        self._client.subscribe([topic], lambda _tps: {}, lambda _tps: None, lambda _tps: None)
        self.records: list[Record] = []

    def until(self, count: int, timeout_s: float) -> list[Record]:
        """Every record read so far, once `count` distinct keys were seen or the time is up."""
        deadline = time.monotonic() + timeout_s
        while len({r.key for r in self.records}) < count and time.monotonic() < deadline:
            record = self._client.poll(0.2)
            if record is not None:
                self.records.append(record)
        return self.records

    def batches(self, count: int, timeout_s: float) -> list[batch_pb2.TrainingBatch]:
        out = []
        for record in self.until(count, timeout_s):
            batch = batch_pb2.TrainingBatch()
            batch.ParseFromString(record.value or b"")
            out.append(batch)
        return out

    def close(self) -> None:
        self._client.close()


def right_text(bg: batch_pb2.BatchGroup) -> str:
    """The completion text that answers the group's (verified) question right."""
    return f"{bg.group.question.answer}</answer>"


def _in_process_core(
    bootstrap: str, topics: TopicNames, settings: SamplerSettings
) -> tuple[SamplerService, CollectorRegistry, Health, KafkaPublisher]:
    """Wired as `SamplerService.from_runtime` wires it, minus the process-wide runtime (signals, logs)."""
    registry = CollectorRegistry()
    transport = TransportMetrics(registry, "sampler")
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap}, transport)
    stop, health = StopFlag(), Health()
    group = f"{settings.topic_prefix}.{NODE}"
    history = read_history(
        consumer(bootstrap, f"{group}.sampler-recovery"),
        topics.batches,
        NODE,
        max_bytes=1 << 24,
        idle_s=settings.recovery_idle_s,
        timeout_s=30,
        stop=stop,
        beat=health.beat,
    )
    assert history is not None
    core = SamplerService(
        settings,
        topics,
        history=history,
        publisher=publisher,
        local_client=consumer(bootstrap, f"{group}.sampler"),
        swarm_client=consumer(bootstrap, f"{group}.sampler-swarm"),
        metrics=SamplerMetrics(registry),
        transport=transport,
        health=health,
        stop=stop,
        dead_letters=DeadLetters(publisher, topics.dlq, "sampler", transport),
    )
    return core, registry, health, publisher


@pytest.mark.parametrize("verify", list(VerifyMode))
def test_lockstep_batches_from_three_peers_with_every_kind_of_bad_input(
    kafka_bootstrap: str, topic_prefix: str, verify: VerifyMode
) -> None:
    """Lazy verification ends with the same batches, counts and dead letters: round 1's tampered group
    is pooled unverified, picked (J=3 needs every peer's group), rejected and dead-lettered then."""
    topics = _topics(kafka_bootstrap, topic_prefix)
    settings = SamplerSettings(
        node_id=NODE,
        verify=verify,
        topic_prefix=topic_prefix,
        questions_per_round=4,
        local_groups=2,
        external_groups=3,
        expected_peers=3,
        max_per_source=1,
        max_payload_bytes=64 * 1024,
        recovery_idle_s=1.0,
        lockstep_timeout_s=30.0,  # rounds close because every peer arrived, never on the timeout
    )
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    records = iter(questions(node_seed=21, count=40))
    rounds = {  # local groups per round: which completions are right (all-equal ones carry no signal)
        0: ((True, False), (False, True, True), (True, False, False), (True, True)),
        1: ((True, False), (False, True), (True, True), (False, False)),
        2: ((True, False), (False, True, True), (True, False, False), (True, True)),
    }
    for round_, corrects in rounds.items():
        for correct in corrects:
            _send(pub, topics.rollouts, real_group(next(records), NODE, correct, round_=round_))
    for peer in PEERS:
        _send(pub, topics.swarm_rollouts, real_group(next(records), peer, round_=0))
    # Round 1 of the swarm: everything that can go wrong. Round 2 comes after it, all good.
    forged = real_group(next(records), "peer-1", (True, False, False), round_=1)
    forged.completions[1].reward = 1.0  # the sender claims a wrong answer is right
    tampered = real_group(next(records), "peer-2", round_=1)
    tampered.question.answer += "0"
    duplicate = real_group(next(records), "peer-3", round_=1)
    oversized = real_group(next(records), "peer-3", round_=1)
    oversized.completions[0].text = "x" * (100 * 1024)
    for group in (forged, tampered, duplicate, duplicate, oversized):
        _send(pub, topics.swarm_rollouts, group)
    pub.send(topics.swarm_rollouts, b"junk", b"\x0a\xff\xff\xff", [])
    for peer in PEERS:
        _send(pub, topics.swarm_rollouts, real_group(next(records), peer, round_=2))
    pub.flush(10)

    core, registry, health, core_pub = _in_process_core(kafka_bootstrap, topics, settings)
    server = OpsServer(registry, health, host="127.0.0.1", port=0).start()
    reader = TopicReader(kafka_bootstrap, topics.batches)
    try:
        core.local.open()
        core.swarm.open()
        deadline = time.monotonic() + 45
        idle_since = time.monotonic()
        while (core.sequence < 3 or time.monotonic() - idle_since < 2) and time.monotonic() < deadline:
            if core.step():
                idle_since = time.monotonic()
        assert health.failing() == []
        core_pub.flush(10)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        batches = reader.batches(3, timeout_s=20)
    finally:
        core.close()
        reader.close()
        server.stop()

    # Round 2 was assembled after all the bad input was consumed: the service kept going.
    assert [(b.batch_id, b.round) for b in batches] == [(f"{NODE}/{r}", r) for r in range(3)]
    local, external = batch_pb2.GROUP_SOURCE_LOCAL, batch_pb2.GROUP_SOURCE_EXTERNAL
    for batch, n_external in zip(batches, (3, 2, 3), strict=True):  # round 1: peer-2's group was bad
        assert [bg.source for bg in batch.groups] == [local] * 2 + [external] * n_external
        peers = [bg.group.node_id for bg in batch.groups[2:]]
        assert len(peers) == len(set(peers))  # max_per_source=1
        assert all(bg.group.round == batch.round for bg in batch.groups)
    for bg in (bg for b in batches for bg in b.groups):  # the receiver's rewards, never the sender's
        truth = [1.0 if c.text == right_text(bg) else 0.0 for c in bg.group.completions]
        assert [r if r == 1.0 else 0.0 for r in bg.rewards] == truth
    [got] = [bg for bg in batches[1].groups if bg.group.group_id == forged.group_id]
    assert got.group.completions[1].reward == 1.0
    assert got.rewards[0] == 1.0
    assert got.rewards[1] < 1.0

    def count(reason: str) -> str:
        return f'sapo_sampler_groups_rejected_total{{reason="{reason}"}}'

    for reason, n in {
        "answer_mismatch": 1,
        "duplicate": 1,
        "undecodable": 1,
        "oversized": 1,
        "no_signal": 4,
        "unused": 2,
    }.items():
        assert f"{count(reason)} {float(n)}" in metrics, reason
    assert "sapo_sampler_batches_emitted_total 3.0" in metrics
    dead = TopicReader(kafka_bootstrap, topics.dlq)
    try:
        reasons = {r.headers["sapo-dlq-reason"] for r in dead.until(3, timeout_s=20)}
    finally:
        dead.close()
    assert reasons == {b"answer_mismatch", b"undecodable", b"oversized"}


def test_the_sampler_counts_the_settings_its_own_generators_publish_with(
    kafka_bootstrap: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Replicas one content setting apart make sapo_sampler_generator_configs 2, said once in the log
    with both fingerprints; a replica that differs only operationally has the same fingerprint; a
    group of an older generator (no header) is pooled as before and counts for nothing; the header of
    a group sent in chunks survives them."""
    caplog.set_level(logging.INFO, logger="sapo.node.sampler")
    topics = _topics(kafka_bootstrap, topic_prefix)
    settings = SamplerSettings(node_id=NODE, topic_prefix=topic_prefix, recovery_idle_s=1.0)
    same = settings_fingerprint(GeneratorSettings(node_id=NODE, node_seed=5))
    assert settings_fingerprint(GeneratorSettings(node_id=NODE, node_seed=5, flush_timeout_s=5.0)) == same
    hotter = settings_fingerprint(GeneratorSettings(node_id=NODE, node_seed=5, temperature=0.7))
    assert hotter != same
    records = iter(questions(node_seed=7, count=5))
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    limit = 70 * 1024  # chunks of 6 KiB (the rest is kept for headers)
    chunking = KafkaPublisher({"bootstrap.servers": kafka_bootstrap}, max_message_bytes=limit)

    def publish(publisher: KafkaPublisher, config: str, *, pad: int = 0) -> None:
        group = real_group(next(records), NODE)
        for completion in group.completions:
            completion.token_ids.extend(range(pad))
        value = group.SerializeToString()
        headers = wire.rollout_headers(group, value, generator_config=config)
        assert len(value) > chunk_size(limit) or not pad
        publisher.send(topics.rollouts, group.group_id.encode(), value, headers)
        assert publisher.flush(10) == 0

    core, registry, _health, _pub = _in_process_core(kafka_bootstrap, topics, settings)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    def pool_local(count: int) -> None:
        deadline = time.monotonic() + 30
        while sample("sapo_sampler_pool_groups", origin="local") != count:
            assert time.monotonic() < deadline, f"not {count} local groups pooled in 30 s"
            core.step()

    try:
        core.local.open()
        core.swarm.open()
        for config in (same, same, ""):  # two groups of one replica, one of an older generator
            publish(pub, config)
        pool_local(3)  # the header-less one too
        assert sample("sapo_sampler_generator_configs") == 1
        publish(chunking, hotter, pad=4000)  # ~24 KB: four chunks
        pool_local(4)
        assert sample("sapo_sampler_generator_configs") == 2
    finally:
        core.close()
    said = [r for r in caplog.records if r.name == "sapo.node.sampler" and "fingerprint" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO, logging.WARNING], [r.getMessage() for r in said]
    assert same in said[0].getMessage()
    assert hotter in said[1].getMessage() and same in said[1].getMessage()


def _sampler_env(bootstrap: str, prefix: str) -> dict[str, str]:
    profile = ConsumerProfile.local()
    env = {
        "NODE_ID": NODE,
        "KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "TOPIC_PREFIX": prefix,
        "CONSUMER__SESSION_TIMEOUT_MS": str(profile.session_timeout_ms),
        "CONSUMER__HEARTBEAT_INTERVAL_MS": str(profile.heartbeat_interval_ms),
        "CONSUMER__FETCH_WAIT_MAX_MS": str(profile.fetch_wait_max_ms),
        "CONSUMER__MAX_POLL_INTERVAL_MS": "10000",
        "HTTP_PORT": "0",
        "LOG_FORMAT": "text",
        "ROUND_MODE": "async",
        "LOCAL_GROUPS": "2",
        "EXTERNAL_GROUPS": "2",
        "MAX_PER_SOURCE": "2",
        "RECOVERY_IDLE_S": "1.5",
        "LEASE_TTL_S": "4",  # a SIGKILLed sampler's lease expires soon: the restart takes it over
    }
    return os.environ | {"PYTHONPATH": str(ROOT)} | {f"SAPO_SAMPLER_{k}": v for k, v in env.items()}


def _get(log_path: Path, path: str) -> str:
    """GET `path` from the ops server of the latest sampler process that logged its port."""
    port = re.findall(r"ops server on :(\d+)", log_path.read_text())[-1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return str(resp.read().decode())


def test_sigkill_mid_stream_neither_loses_nor_repeats_a_batch_or_a_group(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = _topics(kafka_bootstrap, topic_prefix)
    pairs = 24  # one local and one external group each: 12 batches of 2 + 2
    records = questions(node_seed=33, count=2 * pairs)
    # Every local group from version 0: there is no trainer here, and a local group sampled with
    # version p tells the sampler that its trainer trained p batches (sapo.sampler.core follows it),
    # which the test could not make true while it publishes everything ahead of the batches. The
    # policy lag bound is raised accordingly.
    groups = [
        (real_group(records[2 * i], NODE), real_group(records[2 * i + 1], PEERS[i % 3])) for i in range(pairs)
    ]
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    running = threading.Event()

    def publish(pairs: list[tuple[rollout_pb2.RolloutGroup, rollout_pb2.RolloutGroup]]) -> None:
        for local, external in pairs:  # the node's generator and a peer
            _send(pub, topics.rollouts, local)
            _send(pub, topics.swarm_rollouts, external)
            pub.flush(10)
            if running.is_set():
                time.sleep(0.2)

    cmd = [sys.executable, "-m", "services.sampler.main"]
    env = _sampler_env(kafka_bootstrap, topic_prefix) | {"SAPO_SAMPLER_MAX_POLICY_LAG": str(pairs)}
    log_path = tmp_path / "sampler.log"
    reader = TopicReader(kafka_bootstrap, topics.batches)
    producer = threading.Thread(target=publish, args=(groups[4:],), daemon=True)
    with log_path.open("w") as log:
        first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            publish(groups[:4])
            reader.until(1, timeout_s=40)
            running.set()  # the sampler is up: keep publishing while it runs, and kill it meanwhile
            producer.start()
            reader.until(4, timeout_s=20)
        finally:
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        assert len({r.key for r in reader.records}) >= 4, log_path.read_text()[-3000:]
        second = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            producer.join(30)
            batches = reader.batches(pairs // 2, timeout_s=45)
            assert _get(log_path, "/readyz") == "ready\n"  # recovered, partitions assigned
            if kernel_has_custom_slices():  # every thread of the process, as SAPO_SAMPLER_CPU_SLICE_MS says
                assert set(process_slices_ns(second.pid).values()) == {round(DEFAULT_SLICE_MS * 1e6)}
        finally:
            second.send_signal(signal.SIGTERM)
            code = second.wait(20)
    reader.close()

    assert code == 0, log_path.read_text()[-3000:]
    ids = [b.batch_id for b in batches]
    assert len(ids) == len(set(ids)), f"a batch id repeats: {ids}"
    assert sorted(b.sequence for b in batches) == list(range(pairs // 2)), log_path.read_text()[-3000:]
    used = [bg.group.group_id for b in batches for bg in b.groups]
    assert len(used) == len(set(used)), "a group landed in two batches"
    assert set(used) == {g.group_id for pair in groups for g in pair}, "an eligible group was lost"
    assert "emitted" in log_path.read_text()


def test_a_standby_reads_the_pins_kept_while_it_waited_for_the_lease(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The sampler a standby replaces keeps pinning keys (tofu) until it dies: a trust store read when
    the standby started would lack those pins, accept another key for their nodes and drop them from
    the pins file at its first own pin."""
    _topics(kafka_bootstrap, topic_prefix)
    pins = tmp_path / "pins.yaml"
    settings = SamplerSettings(
        node_id=NODE,
        topic_prefix=topic_prefix,
        kafka=KafkaConnection(bootstrap_servers=kafka_bootstrap),
        consumer=ConsumerProfile.local(),
        http_host="127.0.0.1",
        http_port=0,
        recovery_idle_s=1.0,
        identity=IdentitySettings(mode=TrustMode.TOFU, pins_file=pins),
    )
    build = SamplerService.prepare(settings)  # the standby starts: no pins yet
    # Meanwhile the active sampler pins a peer's key, then dies.
    save_trust_list(pins, TrustList().with_key(PEERS[0], NodeKey.generate().public_text))
    runtime = start_runtime("sampler", settings, install_signals=False)
    try:
        service = build(runtime)  # the lease is free: the standby takes over
        assert service is not None
        try:
            assert runtime.registry.get_sample_value("sapo_sampler_trusted_keys") == 1
        finally:
            service.close()
    finally:
        runtime.close()
