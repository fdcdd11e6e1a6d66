"""The environment `sapo swarm` gives each service: its defaults yield to the user's environment, its
wiring and the manifest's values do not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sapo.cpugate import usable_cpus
from sapo.generator.settings import GeneratorSettings
from sapo.settings import ConsumerProfile, load_settings
from sapo.swarm.launcher import Swarm
from sapo.swarm.manifest import Service, parse_manifest
from sapo.trainer.settings import TrainerSettings

pytestmark = pytest.mark.unit


@pytest.fixture
def swarm(tmp_path: Path) -> Swarm:
    manifest = parse_manifest(
        {"name": "t", "defaults": {"model": "tiny:0", "rounds": 2}, "nodes": [{"id": "a"}, {"id": "b"}]}
    )
    swarm = Swarm(manifest, tmp_path, consumer=ConsumerProfile.local_swarm())
    swarm.bootstrap = "127.0.0.1:9"
    return swarm


def env_of(swarm: Swarm, service: Service, base: dict[str, str]) -> dict[str, str]:
    node = swarm.manifest.nodes[0]
    return swarm.service_env(node, service, f"a-{service}", swarm.run_dir / "ports" / service, base)


def use(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the services' variables of `env` this process's, as they would be in the service."""
    for name in [n for n in os.environ if n.startswith("SAPO_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("SAPO_"):
            monkeypatch.setenv(name, value)


def test_the_launchers_defaults_apply_where_the_environment_is_silent(
    swarm: Swarm, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(swarm, "trainer", {"OMP_NUM_THREADS": "1"})
    use(env, monkeypatch)
    settings = load_settings(TrainerSettings)
    assert settings.compute_gate_dir == swarm.run_dir / "gate"
    assert settings.consumer == ConsumerProfile.local_swarm()
    assert settings.log_format == "text"
    assert env["OMP_NUM_THREADS"] == "1"
    # The sampler makes no model calls: no gate.
    assert not any("COMPUTE_GATE" in name for name in env_of(swarm, "sampler", {}))


def test_the_users_environment_overrides_the_launchers_defaults(
    swarm: Swarm, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {
        "SAPO_TRAINER_COMPUTE_GATE_DIR": "",  # empty: no gate
        "SAPO_TRAINER_CONSUMER__FETCH_WAIT_MAX_MS": "77",
        "SAPO_TRAINER_LOG_FORMAT": "json",
    }
    use(env_of(swarm, "trainer", base), monkeypatch)
    settings = load_settings(TrainerSettings)
    assert settings.compute_gate_dir is None
    assert settings.consumer.fetch_wait_max_ms == 77
    # The fields the user left alone keep the launcher's profile, not the Apache Kafka defaults.
    assert settings.consumer.watch_fetch_wait_max_ms == ConsumerProfile.local_swarm().watch_fetch_wait_max_ms
    assert settings.log_format == "json"


def test_the_gate_has_a_slot_per_omp_threads_cpus_of_the_users_setting(swarm: Swarm) -> None:
    one = int(env_of(swarm, "generator", {"OMP_NUM_THREADS": "1"})["SAPO_GENERATOR_COMPUTE_GATE_SLOTS"])
    many = int(env_of(swarm, "generator", {"OMP_NUM_THREADS": "4096"})["SAPO_GENERATOR_COMPUTE_GATE_SLOTS"])
    assert (one, many) == (usable_cpus(), 1)


def test_wiring_and_manifest_values_win_over_the_environment(
    swarm: Swarm, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {
        "SAPO_GENERATOR_NODE_ID": "someone-else",
        "SAPO_GENERATOR_KAFKA__BOOTSTRAP_SERVERS": "elsewhere:9092",
        "SAPO_GENERATOR_MODEL": "tiny:7",
    }
    use(env_of(swarm, "generator", base), monkeypatch)
    settings = load_settings(GeneratorSettings)
    assert (settings.node_id, settings.kafka.bootstrap_servers, settings.model) == (
        "a",
        "127.0.0.1:9",
        "tiny:0",
    )
