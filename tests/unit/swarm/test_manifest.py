"""Swarm manifests: defaults, per-node overrides, errors that name the node and key; env mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo.settings import ConfigError
from sapo.swarm.launcher import flatten_env, service_values
from sapo.swarm.manifest import load_manifest, parse_manifest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


def test_defaults_apply_and_nodes_override() -> None:
    manifest = parse_manifest(
        {
            "name": "t",
            "defaults": {
                "model": "tiny:1",
                "local_groups": 2,
                "external_groups": 2,
                "trainer": {"dtype": "bf16"},
            },
            "nodes": [
                {"id": "a", "seed": 1},
                {"id": "b", "seed": 2, "model": "tiny:2", "trainer": {"lr_warmup": 3}},
            ],
        }
    )
    a, b = manifest.nodes
    assert (a.model, b.model) == ("tiny:1", "tiny:2")
    assert b.trainer == {"dtype": "bf16", "lr_warmup": 3}


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([{"id": "a"}, {"id": "a"}], "repeated: a"),
        ([{"id": "Bad Node"}], "nodes.0.id"),
        ([{"id": "a", "local_groups": 0, "external_groups": 0}], "local_groups \\+ external_groups"),
        ([{"id": "a", "questions_per_round": 2, "local_groups": 4}], "cannot exceed questions_per_round"),
        ([{"id": "a", "typo_key": 1}], "typo_key"),
    ],
)
def test_errors_say_what_to_fix(nodes: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_manifest({"nodes": nodes})


def test_env_mapping_flattens_nested_settings(tmp_path: Path) -> None:
    env = flatten_env("sampler", {"kafka": {"bootstrap_servers": "h:1"}, "local_groups": 3, "flag": True})
    assert env == {
        "SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS": "h:1",
        "SAPO_SAMPLER_LOCAL_GROUPS": "3",
        "SAPO_SAMPLER_FLAG": "true",
    }
    node = parse_manifest({"nodes": [{"id": "a", "sampler": {"local_groups": 1}}]}).nodes[0]
    assert service_values(node, "sampler", tmp_path)["local_groups"] == 1


def test_example_manifests_parse() -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples, "examples/*.yaml missing"
    for path in examples:
        assert load_manifest(path).nodes


def test_one_temperature_reaches_the_generator_and_the_trainer(tmp_path: Path) -> None:
    """The trainer scores peers' rows at its own generator's temperature: one manifest key sets both,
    and so does a raw generator temperature; unset leaves both services at their default."""
    short, raw, unset = parse_manifest(
        {
            "nodes": [
                {"id": "a", "temperature": 0.7},
                {"id": "b", "generator": {"temperature": 0.6}},
                {"id": "c"},
            ]
        }
    ).nodes
    assert service_values(short, "generator", tmp_path)["temperature"] == 0.7
    assert service_values(short, "trainer", tmp_path)["sampling_temperature"] == 0.7
    assert service_values(raw, "trainer", tmp_path)["sampling_temperature"] == 0.6
    assert "temperature" not in service_values(unset, "generator", tmp_path)
    assert "sampling_temperature" not in service_values(unset, "trainer", tmp_path)
