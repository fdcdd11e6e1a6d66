"""Each setting is declared once, in its service's settings class; the chart's values schema and the
swarm manifest derive from those classes, and these tests fail when they drift apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sapo.swarm.manifest import SETTINGS, SHORT_KEYS, NodeSpec
from tests.scripts import load_script

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_chart_schema_lists_every_declared_setting() -> None:
    script = str(ROOT / "scripts/gen_chart_schema.py")
    done = subprocess.run([sys.executable, script, "--check"], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_setting_a_service_declares_is_in_the_chart_schema_or_owned_by_the_chart() -> None:
    gen = load_script("gen_chart_schema")
    schema = json.loads((ROOT / "deploy/k8s/sapo-node/values.schema.json").read_text())
    for service, settings in SETTINGS.items():
        listed = set(schema["properties"][service]["properties"]["settings"]["properties"])
        for env in gen.env_fields(settings):
            owned = env in gen.CHART_OWNED or env.startswith(gen.CHART_OWNED_PREFIXES)
            assert (env in listed) != owned, f"{service} setting {env}: neither in the schema nor chart-owned"


def test_manifest_short_keys_target_declared_settings_and_cover_the_node_spec() -> None:
    for key, targets in SHORT_KEYS.items():
        for service, field in targets:
            assert field in SETTINGS[service].model_fields, f"manifest key {key} -> {service}.{field}"
    own = {"id", "generator", "sampler", "trainer", "generator_replicas"}
    assert set(NodeSpec.model_fields) - own == set(SHORT_KEYS), "a manifest key without a settings target"


def test_manifest_keys_declare_no_bound_or_default_of_their_own() -> None:
    """A short key is `None` unless the manifest sets it, so the service's default applies; only
    `rounds` is required (a local run must end)."""
    for key in SHORT_KEYS:
        info = NodeSpec.model_fields[key]
        if key == "rounds":
            assert info.is_required()
            continue
        assert info.default is None, key
        assert not info.metadata, f"manifest key {key} re-declares a bound: {info.metadata}"
