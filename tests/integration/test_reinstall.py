"""A node reinstalled with its checkpoints kept but its topics gone (`helm uninstall` + `helm install`
where the topics were deleted, or a brand-new Kafka cluster): the node's next batch is trained, not
skipped as a duplicate, and the trainer does not wait at an offset of the old batch topic.

Through real processes: the node's generator, sampler and trainer on one embedded broker until a few
versions are trained, everything stopped (the trainer writes its full state), then the same node with
the same checkpoint root on a FRESH embedded broker (new storage: no topics, no group offsets).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo.checkpoints import CheckpointStore
from sapo.swarm.history import read_rows
from sapo.swarm.launcher import ServiceProcess, Swarm
from sapo.swarm.manifest import SwarmManifest, parse_manifest

pytestmark = pytest.mark.integration
NODE = "node-a"
FIRST_VERSIONS = 3
BATCHES = (("partition", "0"), ("topic", f"sapo.node.{NODE}.batches"))


def manifest() -> SwarmManifest:
    """One node, lock-step rounds of local groups only, on the launcher's own broker (no bootstrap)."""
    return parse_manifest(
        {
            "name": "reinstall",
            "topic_prefix": "sapo",
            "defaults": {
                "model": "tiny:1",
                "questions_per_round": 2,
                "completions_per_question": 2,
                "local_groups": 2,
                "external_groups": 0,
                "rounds": 50,  # more than either phase trains: rounds left to plan after the restart
                "max_new_tokens": 8,
                "sampler": {"lease_ttl_s": 6},
                "trainer": {"lease_ttl_s": 6},
            },
            "nodes": [{"id": NODE, "seed": 1}],
        }
    )


def wait(condition: Callable[[], bool], timeout_s: float, what: str, swarm: Swarm) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        failed = [p.name for p in swarm.failed()]
        assert not failed, f"{failed} exited while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)


def version(swarm: Swarm) -> int:
    assert swarm.recorder is not None
    swarm.recorder.drain()
    return swarm.recorder.latest.get(NODE, -1)


def scrape(process: ServiceProcess) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """A service's /metrics, parsed: sample name -> labels -> value."""
    assert process.metrics_url is not None
    text = urllib.request.urlopen(process.metrics_url, timeout=10).read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def test_a_reinstalled_node_trains_its_next_batch(tmp_path: Path) -> None:
    first = Swarm(manifest(), tmp_path)
    try:
        first.start()
        assert first.broker is not None
        first_cluster = first.broker.cluster_id
        wait(lambda: version(first) >= FIRST_VERSIONS, 240, f"version {FIRST_VERSIONS}", first)
    finally:
        first.stop()  # the broker goes with it: topics, batches and group offsets are gone
    assert not first.failed(), [p.name for p in first.failed()]
    stored = CheckpointStore(str(first.checkpoints)).latest(NODE)
    assert stored is not None
    trained = stored.manifest.version  # the trainer's state on stop: the version it resumes at
    assert trained >= FIRST_VERSIONS

    second = Swarm(manifest(), tmp_path)  # same run directory: the same checkpoint root
    processes: dict[str, ServiceProcess] = {}
    try:
        second.start()
        assert second.broker is not None and second.broker.cluster_id != first_cluster
        processes = {p.service: p for p in second.processes}
        wait(
            lambda: version(second) >= trained + 2, 240, f"version {trained + 2} after the reinstall", second
        )
        lag = "sapo_trainer_consumer_lag_messages"  # refreshed every CONSUMER__STATISTICS_INTERVAL_MS
        wait(lambda: BATCHES in scrape(processes["trainer"]).get(lag, {}), 60, "the lag gauge", second)
        trainer = scrape(processes["trainer"])
        sampler = scrape(processes["sampler"])
    finally:
        second.stop()

    steps = [r for r in read_rows(tmp_path / "steps" / f"{NODE}.jsonl") if r["version"] > trained]
    assert [(r["version"], r["batch_id"]) for r in steps[:2]] == [
        (trained + 1, f"{NODE}/{trained}"),  # the sequence continues where the trainer stopped
        (trained + 2, f"{NODE}/{trained + 1}"),
    ]
    assert trainer["sapo_trainer_batches_total"][(("outcome", "duplicate"),)] == 0
    assert trainer["sapo_trainer_input_offsets_reset_total"][()] == 1
    assert trainer[lag][BATCHES] >= 0
    assert sampler["sapo_sampler_sequence_jumps_total"][()] >= 1
    trainer_log = processes["trainer"].log_path.read_text()
    assert "beyond the end" in trainer_log
    assert "already trained" not in trainer_log.split("resumed at")[-1]  # nothing skipped after it
