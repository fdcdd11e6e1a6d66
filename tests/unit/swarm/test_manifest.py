"""Swarm manifests: defaults, per-node overrides, errors that name the node and key; env mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo.settings import ConfigError, ConsumerProfile
from sapo.swarm.launcher import flatten_env
from sapo.swarm.manifest import load_manifest, parse_manifest, resolve, service_values, swarm_profiles
from sapo.tasks import config_digests, load_profile

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


def test_defaults_apply_and_nodes_override() -> None:
    manifest = parse_manifest(
        {
            "name": "t",
            "defaults": {
                "model": "tiny:1",
                "rounds": 3,
                "local_groups": 2,
                "external_groups": 2,
                "trainer": {"precision": "fp32"},
            },
            "nodes": [
                {"id": "a", "seed": 1},
                {"id": "b", "seed": 2, "model": "tiny:2", "trainer": {"warmup_steps": 3}},
            ],
        }
    )
    a, b = manifest.nodes
    assert (a.model, b.model) == ("tiny:1", "tiny:2")
    assert b.trainer == {"precision": "fp32", "warmup_steps": 3}


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([{"id": "a"}, {"id": "a"}], "repeated: a"),
        ([{"id": "Bad Node"}], "nodes.0.id"),
        ([{"id": "a", "rounds": None}], "nodes.0.rounds"),
        ([{"id": "a", "local_groups": 0, "external_groups": 0}], "SAPO_SAMPLER_LOCAL_GROUPS"),
        ([{"id": "a", "questions_per_round": 2, "local_groups": 4}], "LOCAL_GROUPS <= SAPO_SAMPLER_QUEST"),
        ([{"id": "a", "local_groups": 999}], "(?s)node a: .*LOCAL_GROUPS \\(manifest key local_groups\\)"),
        ([{"id": "a", "sampler": {"lokal_groups": 1}}], "(?i)lokal_groups"),
        ([{"id": "a", "typo_key": 1}], "typo_key"),
    ],
)
def test_errors_say_what_to_fix(nodes: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_manifest({"defaults": {"rounds": 2}, "nodes": nodes})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": {"node-a": {"seed": 1}}}, "`nodes` is a list of nodes .*got a dict"),
        ({"nodes": [5]}, r"nodes\[0\] is a mapping .*got 5"),
        ({"defaults": 3, "nodes": [{"id": "a"}]}, "`defaults` is a mapping of settings, got 3"),
    ],
)
def test_a_manifest_of_the_wrong_shape_says_so(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_manifest(data)


def test_nodes_that_all_fail_are_not_reported_as_no_nodes() -> None:
    with pytest.raises(ConfigError) as error:
        parse_manifest({"defaults": {"rounds": -2}, "nodes": [{"id": "a"}, {"id": "b"}]})
    assert str(error.value).splitlines()[1:] == [
        "  nodes.0.rounds: Input should be greater than 0",
        "  nodes.1.rounds: Input should be greater than 0",
    ]


def test_unset_short_keys_take_the_services_defaults(tmp_path: Path) -> None:
    manifest = parse_manifest({"nodes": [{"id": "a", "rounds": 2}, {"id": "b", "rounds": 2, "seed": 5}]})
    a, b = (resolve(manifest, n, tmp_path) for n in manifest.nodes)
    assert a.generator.max_new_tokens == 256 and a.sampler.local_groups == 4  # the settings' defaults
    assert a.generator.effective_node_seed != b.generator.effective_node_seed
    assert (b.generator.node_seed, b.sampler.seed, b.trainer.seed) == (5, 5, 5)
    assert a.sampler.expected_peers == 1
    assert a.trainer.rounds == 2


def test_a_swarm_on_the_embedded_broker_trades_fetch_latency_for_broker_cpu(tmp_path: Path) -> None:
    """Its services poll at the local swarm's waits, not the tests' shorter ones; watchers wait longest."""
    manifest = parse_manifest({"nodes": [{"id": "a", "rounds": 2}]})
    settings = resolve(manifest, manifest.nodes[0], tmp_path)
    for service in (settings.generator, settings.sampler, settings.trainer):
        assert service.consumer == ConsumerProfile.local_swarm()
        assert service.consumer.fetch_wait_max_ms > ConsumerProfile.local().fetch_wait_max_ms
        assert service.consumer.watch_fetch_wait_max_ms > service.consumer.fetch_wait_max_ms
    given = parse_manifest({"bootstrap": "kafka:9092", "nodes": [{"id": "a", "rounds": 2}]})
    assert resolve(given, given.nodes[0], tmp_path).sampler.consumer == ConsumerProfile()  # Kafka defaults


def test_env_mapping_flattens_nested_settings(tmp_path: Path) -> None:
    env = flatten_env("sampler", {"kafka": {"bootstrap_servers": "h:1"}, "local_groups": 3, "flag": True})
    assert env == {
        "SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS": "h:1",
        "SAPO_SAMPLER_LOCAL_GROUPS": "3",
        "SAPO_SAMPLER_FLAG": "true",
    }
    node = parse_manifest({"nodes": [{"id": "a", "rounds": 1, "sampler": {"local_groups": 1}}]}).nodes[0]
    assert service_values(node, "sampler", 0)["local_groups"] == 1
    deadline = parse_manifest({"nodes": [{"id": "a", "rounds": 1, "round_mode": "deadline"}]}).nodes[0]
    assert service_values(deadline, "trainer", 0)["round_mode"] == "async"


def test_example_manifests_parse() -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples, "examples/*.yaml missing"
    for path in examples:
        assert load_manifest(path).nodes


def test_one_temperature_reaches_the_generator_and_the_trainer() -> None:
    """The trainer scores peers' rows at its own generator's temperature: one manifest key sets both,
    and so does a raw generator temperature; unset leaves both services at their default."""
    short, raw, unset = parse_manifest(
        {
            "nodes": [
                {"id": "a", "rounds": 1, "temperature": 0.7},
                {"id": "b", "rounds": 1, "generator": {"temperature": 0.6}},
                {"id": "c", "rounds": 1},
            ]
        }
    ).nodes
    assert service_values(short, "generator", 0)["temperature"] == 0.7
    assert service_values(short, "trainer", 0)["sampling_temperature"] == 0.7
    assert service_values(raw, "trainer", 0)["sampling_temperature"] == 0.6
    assert "temperature" not in service_values(unset, "generator", 0)
    assert "sampling_temperature" not in service_values(unset, "trainer", 0)


def test_samplers_accept_the_configurations_of_every_profile_in_the_swarm(tmp_path: Path) -> None:
    """A silo swarm: each node draws one task; every sampler re-derives the others' too (and nothing
    else), so sharing works and a foreign configuration is refused."""
    manifest = parse_manifest(
        {
            "defaults": {"rounds": 2},
            "nodes": [
                {"id": "a", "profile": "easy:basic_arithmetic"},
                {"id": "b", "profile": "easy:calendar_arithmetic"},
                {"id": "c", "generator": {"profile": "easy:basic_arithmetic"}},
            ],
        }
    )
    assert swarm_profiles(manifest) == ("easy:basic_arithmetic", "easy:calendar_arithmetic")
    a = resolve(manifest, manifest.nodes[0], tmp_path)
    assert a.sampler.accepted_profiles == ("easy:basic_arithmetic", "easy:calendar_arithmetic")
    wanted = config_digests(load_profile("easy:basic_arithmetic,calendar_arithmetic"))
    assert a.sampler.accepted_configs() == wanted
    assert not config_digests(load_profile("easy:propositional_logic")) & wanted


def test_a_manifest_that_is_not_utf8_text_says_so(tmp_path: Path) -> None:
    """It ended `sapo swarm` in a UnicodeDecodeError traceback."""
    path = tmp_path / "swarm.yaml"
    path.write_bytes(b"\xff\xfe name: x")
    with pytest.raises(ConfigError, match=f"^cannot read swarm manifest {path}: 'utf-8' codec can't decode"):
        load_manifest(path)
