"""Weights through an object store, end to end: real trainer and generator processes, the embedded
broker and a real S3 API (moto on 127.0.0.1, a fresh bucket). The trainer publishes to `s3://`, the
generator hot-reloads from it; a version whose manifest appears late is retried and loaded; a corrupt
one is rejected and counted in the generator's /metrics."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo import storage
from sapo.checkpoints import MANIFEST, CheckpointStore, Written
from sapo.models import build_tiny_model, load_bundled_tokenizer
from tests.integration import trainer_support as ts
from tests.integration.generator_helpers import announce, http_get, launch_generator
from tests.unit.generator.harness import flip_byte, policy_update
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.integration
TAKEN_OVER = 10**6
"""The lease epoch of the test's hand-written announcements: a trainer that took over from the real one
(generators refuse an update of an epoch lower than one they have seen)."""


class Probe:
    """A service process's /metrics, /readyz and /healthz, found through its port file."""

    def __init__(self, port_file: Path) -> None:
        self._port_file = port_file

    def _get(self, path: str) -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{self._port_file.read_text()}{path}")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        if not self._port_file.exists():
            return None
        for family in text_string_to_metric_families(self._get("/metrics")[1]):
            for sample in family.samples:
                if sample.name == name and sample.labels == (labels or {}):
                    return float(sample.value)
        return None

    def ready(self) -> int:
        return self._get("/readyz")[0]


def test_trainer_publishes_to_s3_and_a_generator_reloads_retries_and_rejects(
    kafka_bootstrap: str, topic_prefix: str, s3_url: str, tmp_path: Path
) -> None:
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    tokenizer = load_bundled_tokenizer()
    batches = ts.make_batches(b.tiny(tokenizer), tokenizer, b.questions(1), count=2)
    ts.publish(kafka_bootstrap, topics.batches, batches)
    trainer_log, generator_log = tmp_path / "trainer.log", tmp_path / "generator.log"
    env = ts.trainer_env(kafka_bootstrap, topic_prefix, tmp_path) | {"SAPO_TRAINER_CHECKPOINT_ROOT": s3_url}
    with trainer_log.open("w") as out:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "services.trainer.main"], env=env, cwd=ts.ROOT, stdout=out, stderr=out
        )
    port_file = tmp_path / "generator.port"
    generator = launch_generator(
        kafka_bootstrap,
        topic_prefix,
        generator_log,
        {
            "NODE_ID": ts.NODE,
            "COMPLETIONS_PER_QUESTION": "2",
            "MAX_NEW_TOKENS": "2",
            "HTTP_PORT_FILE": str(port_file),
            "WEIGHTS_RETRY_INITIAL_S": "0.2",
            "WEIGHTS_RETRY_MAX_S": "0.5",
        },
    )
    probe = Probe(port_file)
    store = CheckpointStore(s3_url, keep_last=10)

    def publish(version: int) -> Written:
        """A version as the trainer would write it (tiny:<version>'s weights)."""
        state = build_tiny_model(tokenizer, seed=version).state_dict()
        written = store.publish(ts.NODE, version, state, base_model="tiny:0").written
        assert written is not None
        return written

    try:
        version = "sapo_generator_policy_version"
        ts.wait_for(lambda: probe.metric(version) == len(batches), 120, "the trainer's last version", 0.2)
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(30) == 0, trainer_log.read_text()[-3000:]
        assert store.versions(ts.NODE) == [0, 1, 2]
        assert store.stored(ts.NODE, 2).manifest_uri.startswith(s3_url)
        assert (probe.metric("sapo_generator_weight_load_seconds_count") or 0) >= 1

        # Version 3 is announced before its manifest is visible: retried, then loaded.
        late = publish(3)
        manifest = late.directory / MANIFEST
        data = storage.read_bytes(manifest)
        manifest.fs.rm_file(manifest.path)
        announce(kafka_bootstrap, topics.policy, ts.NODE, policy_update(late, ts.NODE, 3, epoch=TAKEN_OVER))
        retries = "sapo_generator_weight_load_retries_total"
        ts.wait_for(lambda: (probe.metric(retries, {"reason": "missing"}) or 0) >= 1, 60, "a retry", 0.2)
        assert probe.ready() == 503  # behind the announced version
        manifest.fs.pipe_file(manifest.path, data)
        ts.wait_for(lambda: probe.metric(version) == 3, 60, "version 3 once visible", 0.2)
        assert probe.ready() == 200
        retried = probe.metric(retries, {"reason": "missing"})

        # Version 4 is corrupt: rejected once, counted, not retried; version 5 loads.
        corrupt = publish(4)
        flip_byte(corrupt)
        announce(
            kafka_bootstrap, topics.policy, ts.NODE, policy_update(corrupt, ts.NODE, 4, epoch=TAKEN_OVER)
        )
        failures = "sapo_generator_weight_load_failures_total"
        rejected = {"reason": "digest_mismatch"}
        ts.wait_for(lambda: probe.metric(failures, rejected) == 1, 60, "the rejection", 0.2)
        # Kept at v3; ready: no work waits for v4, and its bytes would fail again after a restart.
        assert probe.metric(version) == 3 and probe.ready() == 200
        announce(
            kafka_bootstrap, topics.policy, ts.NODE, policy_update(publish(5), ts.NODE, 5, epoch=TAKEN_OVER)
        )
        ts.wait_for(lambda: probe.metric(version) == 5, 60, "version 5", 0.2)
        assert probe.ready() == 200
        assert probe.metric(failures, rejected) == 1
        assert probe.metric(retries, {"reason": "missing"}) == retried  # the corrupt one was not retried
    finally:
        for process in (trainer, generator):
            process.kill()
            process.wait(10)
    assert "rejected policy v4 (digest_mismatch)" in generator_log.read_text()
