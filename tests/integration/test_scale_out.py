"""Scaling a node out through real processes: generator replicas sharing the node's work (one killed
with SIGKILL mid-round and restarted), and a second trainer and sampler fenced by the lease."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import TypeVar

import pytest
from google.protobuf.message import Message

from sapo.malloc import with_malloc_tunable
from sapo.settings import ConsumerProfile
from sapo.swarm.launcher import ServiceProcess, Swarm
from sapo.swarm.manifest import Service, parse_manifest
from sapo.topics import TopicNames
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2
from sapo.wire import decode
from tests.integration.kafka_helpers import read_topic

pytestmark = pytest.mark.integration
M = TypeVar("M", bound=Message)
ROUNDS = 4
QUESTIONS = 6


def _metric(process: ServiceProcess, name: str) -> float | None:
    url = process.metrics_url
    if url is None:
        return None
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _ready(process: ServiceProcess) -> bool:
    """Whether the process's /readyz answers 200."""
    url = process.metrics_url
    if url is None:
        return False
    try:
        with urllib.request.urlopen(url.removesuffix("/metrics") + "/readyz", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:  # a 503 too
        return False


def _wait(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)


def _decoded(bootstrap: str, topic: str, cls: type[M]) -> list[M]:
    return [decode(cls, r.value, 1 << 26) for r in read_topic(bootstrap, topic)]


def _versions(swarm: Swarm, node: str) -> int:
    assert swarm.recorder is not None
    swarm.recorder.drain()
    return swarm.recorder.latest.get(node, -1)


def _manifest(bootstrap: str, prefix: str, replicas: int) -> object:
    return parse_manifest(
        {
            "name": "scale",
            "bootstrap": bootstrap,
            "topic_prefix": prefix,
            "defaults": {
                "model": "tiny:1",
                "questions_per_round": QUESTIONS,
                "completions_per_question": 3,
                "local_groups": QUESTIONS,
                "external_groups": 0,
                "rounds": ROUNDS,
                "max_new_tokens": 48,  # long enough that killing a replica lands mid-round
                "generator_replicas": replicas,
                "sampler": {"lockstep_local_timeout_s": 300, "lease_ttl_s": 6},
                "trainer": {"lease_ttl_s": 6},
            },
            "nodes": [{"id": "node-a", "seed": 3}],
        }
    )


def _swarm(manifest: object, run_dir: Path) -> Swarm:
    """The test broker's timings (a swarm given a bootstrap otherwise runs with the Apache Kafka
    defaults: 45 s sessions, which the embedded broker turns into 22 s group joins, one per process
    start and rebalance)."""
    return Swarm(manifest, run_dir, consumer=ConsumerProfile.local())  # type: ignore[arg-type]


def test_three_replicas_share_the_rounds_and_survive_a_sigkill(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    swarm = _swarm(_manifest(kafka_bootstrap, topic_prefix, replicas=3), tmp_path)
    topics = TopicNames.for_node("node-a", topic_prefix)
    try:
        swarm.start()
        generators = [p for p in swarm.processes if p.service == "generator"]
        assert len(generators) == 3
        _wait(lambda: _versions(swarm, "node-a") >= 1, 240, "round 0 trained")
        # Read once it runs: right after Popen returns, the new program's environment may not be
        # mapped yet, and /proc then shows none.
        environ = Path(f"/proc/{generators[0].proc.pid}/environ").read_bytes().split(b"\0")
        tunables = with_malloc_tunable(os.environ)["GLIBC_TUNABLES"]  # huge pages for torch (sapo.malloc)
        assert f"GLIBC_TUNABLES={tunables}".encode() in environ
        victim = generators[1]
        victim.proc.send_signal(signal.SIGKILL)  # mid-round 1: its items are re-delivered to the others
        victim.proc.wait(timeout=30)
        _wait(lambda: _versions(swarm, "node-a") >= 2, 240, "round 1 trained without the victim")
        node = swarm.manifest.nodes[0]
        swarm.processes.append(swarm.spawn(node, "generator", victim.replica))  # back: a rebalance
        _wait(lambda: _versions(swarm, "node-a") >= ROUNDS, 300, f"all {ROUNDS} rounds trained")
        failed = [p.name for p in swarm.failed() if p is not victim]
        assert not failed, failed
    finally:
        swarm.stop()

    rollouts = read_topic(kafka_bootstrap, topics.rollouts)
    groups = [decode(rollout_pb2.RolloutGroup, r.value, 1 << 26) for r in rollouts]
    ids: dict[tuple[int, int], set[str]] = defaultdict(set)
    for g in groups:
        ids[(g.round, g.position)].add(g.group_id)
    expected = {(r, p) for r in range(ROUNDS) for p in range(QUESTIONS)}
    assert expected <= set(ids)  # every question of every round was generated
    assert all(len(v) == 1 for v in ids.values())  # an item sampled twice is the same group
    assert len({g.round for g in groups if g.policy_version != g.round}) == 0  # lock-step kept
    batches = [
        decode(batch_pb2.TrainingBatch, r.value, 1 << 26) for r in read_topic(kafka_bootstrap, topics.batches)
    ]
    assert sorted(b.sequence for b in batches) == list(range(ROUNDS))
    trained = [(bg.group.round, bg.group.position) for b in batches for bg in b.groups]
    assert len(trained) == len(set(trained))  # no question in two batches, none trained twice
    assert all(bg.group.round == b.round for b in batches for bg in b.groups)
    per_replica = defaultdict(int)
    for log in (tmp_path / "logs").glob("node-a-generator*.log"):
        per_replica[log.name] = log.read_text().count(" groups (")
    assert sum(1 for count in per_replica.values() if count) >= 2, per_replica  # the work was shared


def test_a_second_trainer_and_sampler_stand_by_and_take_over_when_the_first_stops(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    swarm = _swarm(_manifest(kafka_bootstrap, topic_prefix, replicas=1), tmp_path)
    topics = TopicNames.for_node("node-a", topic_prefix)
    roles: tuple[Service, ...] = ("trainer", "sampler")
    try:
        swarm.start()
        _wait(lambda: _versions(swarm, "node-a") >= 1, 240, "round 0 trained")
        node = swarm.manifest.nodes[0]
        second = {role: swarm.spawn(node, role, replica=1) for role in roles}
        swarm.processes += list(second.values())
        for role, process in second.items():
            _wait(lambda p=process: p.log_path.exists() and "standby" in p.log_path.read_text(), 120, role)
            assert _metric(process, f"sapo_{role}_lease_held") == 0
            assert "holds the lease" in process.log_path.read_text()
            # Ready as a standby, so that a Deployment with one finishes its rollout.
            _wait(lambda p=process: _ready(p), 60, f"{role} standby ready")
        first = {p.service: p for p in swarm.processes if p.replica == 0 and p.service in second}
        updates = _decoded(kafka_bootstrap, topics.policy, policy_pb2.PolicyUpdate)
        assert len({u.epoch for u in updates}) == 1  # only the first trainer announced
        for role in roles:
            first[role].proc.send_signal(signal.SIGTERM)  # a clean stop releases the lease
            first[role].proc.wait(timeout=120)
            held = f"sapo_{role}_lease_held"
            _wait(lambda p=second[role], h=held: _metric(p, h) == 1, 120, f"{role} takeover")
        _wait(lambda: _versions(swarm, "node-a") >= ROUNDS, 300, "the standbys finish the run")
    finally:
        swarm.stop()
    updates = _decoded(kafka_bootstrap, topics.policy, policy_pb2.PolicyUpdate)
    assert len({u.epoch for u in updates}) == 2
    assert [u.epoch for u in updates] == sorted(u.epoch for u in updates)  # the newer holder after the older
