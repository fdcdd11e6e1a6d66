"""The generator's settings fingerprint: every setting is either content (changes the digest) or
operational (does not), the profile counts by what it resolves to, and the digest is the same in
another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sapo.generator.fingerprint import settings_fingerprint
from sapo.generator.settings import GeneratorSettings
from sapo.identity import NodeKey
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.tasks import EASY_PROFILE
from sapo.wire import GENERATOR_CONFIG_CHARS

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]

BASE: dict[str, Any] = {"node_id": "node-a", "node_seed": 11, "model": "org/policy"}
"""An HF model id, so that the vLLM backend is a valid change too."""

CONTENT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # setting: (base overrides, changed overrides)
    "model": ({}, {"model": "org/other-policy"}),
    "device": ({}, {"device": "cuda"}),
    "backend": ({}, {"backend": "vllm"}),
    "dtype": ({}, {"dtype": "bfloat16"}),
    "quantization": ({}, {"quantization": "int8-dynamic"}),
    "profile": ({}, {"profile": "paper"}),
    "node_seed": ({}, {"node_seed": 12}),
    "completions_per_question": ({}, {"completions_per_question": 4}),
    "temperature": ({}, {"temperature": 0.7}),
    "top_p": ({}, {"top_p": 0.9}),
    "max_new_tokens": ({}, {"max_new_tokens": 128}),
    "sharing": ({}, {"sharing": "variance"}),
    "share_fraction": (
        {"sharing": "fraction", "share_fraction": 0.5},
        {"sharing": "fraction", "share_fraction": 0.25},
    ),
}
"""Settings that decide what a replica publishes for a work item."""

OPERATIONAL: dict[str, dict[str, Any]] = {
    "node_id": {"node_id": "node-b"},  # the seed is set: the node id enters only through its seed
    "kafka": {"kafka": KafkaConnection(bootstrap_servers="broker:9093")},
    "swarm_kafka": {"swarm_kafka": KafkaConnection(bootstrap_servers="swarm:9092")},
    "consumer": {"consumer": ConsumerProfile(fetch_wait_max_ms=50)},
    "topic_prefix": {"topic_prefix": "other"},
    "http_host": {"http_host": "127.0.0.1"},
    "http_port": {"http_port": 9999},
    "http_port_file": {"http_port_file": Path("/tmp/port")},
    "log_level": {"log_level": "DEBUG"},
    "log_format": {"log_format": "text"},
    "cpu_slice_ms": {"cpu_slice_ms": 10.0},
    "compute_gate_dir": {"compute_gate_dir": Path("/tmp/gate")},
    "compute_gate_slots": {"compute_gate_slots": 2},
    "max_message_bytes": {"max_message_bytes": 2 << 20},
    "stop_broker_wait_s": {"stop_broker_wait_s": 2.0},
    "max_payload_bytes": {"max_payload_bytes": 32 << 20},
    "identity": {"identity": {"private_key": NodeKey.generate().pem().decode()}},
    "max_batch_items": {"max_batch_items": 8},
    "max_version_lead": {"max_version_lead": 5},
    "policy_catchup_idle_s": {"policy_catchup_idle_s": 1.0},
    "flush_timeout_s": {"flush_timeout_s": 10.0},
    "liveness_timeout_s": {"liveness_timeout_s": 600.0},
    "weights_retry_initial_s": {"weights_retry_initial_s": 1.0},
    "weights_retry_max_s": {"weights_retry_max_s": 30.0},
    "weights_retry_give_up_s": {"weights_retry_give_up_s": 60.0},
    "weights_max_behind_s": {"weights_max_behind_s": 60.0},
}
"""Settings that change how a replica runs, not what it publishes."""


def _fingerprint(**overrides: Any) -> str:
    return settings_fingerprint(GeneratorSettings(**(BASE | overrides)))


def test_every_setting_is_content_or_operational() -> None:
    """A new setting fails here until it is put on one side (and into the digest if content)."""
    assert not CONTENT.keys() & OPERATIONAL.keys()
    assert CONTENT.keys() | OPERATIONAL.keys() == GeneratorSettings.model_fields.keys()


@pytest.mark.parametrize("name", sorted(CONTENT))
def test_a_content_setting_changes_the_fingerprint(name: str) -> None:
    base, changed = CONTENT[name]
    assert _fingerprint(**base) != _fingerprint(**changed)


@pytest.mark.parametrize("name", sorted(OPERATIONAL))
def test_an_operational_setting_leaves_the_fingerprint(name: str) -> None:
    assert _fingerprint() == _fingerprint(**OPERATIONAL[name])


def test_the_profile_counts_by_what_it_resolves_to(tmp_path: Path) -> None:
    """Two profile files that resolve to the same tasks are the same content, whatever their paths or
    the order of their keys; a dataset configuration that differs is not. The device's index is no
    content; the node id is once it derives the seed."""
    tasks: dict[str, dict[str, Any]] = {
        s.name: {"weight": s.weight, "config": dict(s.config)} for s in EASY_PROFILE
    }
    written, reordered, harder = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    written.write_text(yaml.safe_dump(tasks, sort_keys=True))
    reordered.write_text(yaml.safe_dump(dict(reversed(tasks.items())), sort_keys=False))
    tasks["basic_arithmetic"]["config"]["max_digits"] = 3
    harder.write_text(yaml.safe_dump(tasks))
    assert _fingerprint(profile=str(written)) == _fingerprint(profile=str(reordered))
    assert _fingerprint(profile=str(written)) != _fingerprint(profile=str(harder))
    assert _fingerprint(device="cuda:0") == _fingerprint(device="cuda:1")
    unseeded = {"node_seed": None}
    assert _fingerprint(**unseeded) != _fingerprint(**unseeded, node_id="node-b")


def test_the_fingerprint_is_the_same_in_another_process() -> None:
    variants = [{}, {"profile": "paper", "temperature": 0.5}]
    here = [_fingerprint(**v) for v in variants]
    assert all(len(f) == GENERATOR_CONFIG_CHARS and int(f, 16) >= 0 for f in here)
    script = (
        "import sys, json\n"
        "from sapo.generator.fingerprint import settings_fingerprint\n"
        "from sapo.generator.settings import GeneratorSettings\n"
        "for v in json.loads(sys.argv[1]):\n"
        "    print(settings_fingerprint(GeneratorSettings(**v)))\n"
    )
    for hash_seed in ("1", "2"):  # nothing depends on Python's per-process string hashing
        env = os.environ | {"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps([BASE | v for v in variants])],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=120,
        )
        assert done.stdout.split() == here
