"""Sampler settings: env names, defaults, and cross-field errors that say what to set."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo.identity import TrustMode
from sapo.sampler import MixPolicy, RoundMode, SelectionPolicy, VerifyMode
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConfigError, load_settings
from sapo.tasks import EASY_PROFILE, PAPER_PROFILE, TaskStream, config_digests, load_profile

pytestmark = pytest.mark.unit


def test_env_names_and_nested_consumer_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "node-3")
    monkeypatch.setenv("SAPO_SAMPLER_ROUND_MODE", "async")
    monkeypatch.setenv("SAPO_SAMPLER_SELECTION", "reward_guided")
    monkeypatch.setenv("SAPO_SAMPLER_VERIFY", "eager")
    monkeypatch.setenv("SAPO_SAMPLER_ACCEPTED_TASKS", '["calendar_arithmetic", "basic_arithmetic"]')
    monkeypatch.setenv("SAPO_SAMPLER_CONSUMER__SESSION_TIMEOUT_MS", "6000")
    s = load_settings(SamplerSettings)
    assert (s.node_id, s.round_mode) == ("node-3", RoundMode.ASYNC)
    assert s.selection is SelectionPolicy.REWARD_GUIDED
    assert s.accepted_tasks == frozenset({"calendar_arithmetic", "basic_arithmetic"})
    assert s.consumer.session_timeout_ms == 6000
    assembly = s.assembly_config()
    assert (assembly.mix.local, assembly.mix.external) == (4, 4)
    assert s.identity.mode is TrustMode.OFF
    assert s.screen_config().verify is VerifyMode.EAGER


def test_defaults_reproduce_the_papers_best_swarm() -> None:
    s = SamplerSettings(node_id="n")
    assert s.verify is VerifyMode.EAGER
    assert (s.round_mode, s.local_groups, s.external_groups, s.selection) == (
        RoundMode.LOCKSTEP,
        4,
        4,
        SelectionPolicy.UNIFORM,
    )


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"local_groups": 0, "external_groups": 0}, "SAPO_SAMPLER_LOCAL_GROUPS"),
        ({"local_groups": 9, "questions_per_round": 8}, "SAPO_SAMPLER_QUESTIONS_PER_ROUND"),
        (
            {"mix_policy": MixPolicy.ADAPTIVE, "adaptive_max_external": 9},
            "SAPO_SAMPLER_ADAPTIVE_MAX_EXTERNAL",
        ),
        ({"accepted_tasks": ["calendar_arithmetic", "countdown"]}, "countdown"),
        ({"accepted_tasks": ["no_such_task"]}, "no_such_task"),
        ({"max_per_source": 0}, "SAPO_SAMPLER_MAX_PER_SOURCE"),
        ({"verify": VerifyMode.LAZY, "selection": SelectionPolicy.REWARD_GUIDED}, "SAPO_SAMPLER_VERIFY"),
    ],
)
def test_invalid_combinations_say_what_to_set(overrides: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(SamplerSettings, node_id="n", **overrides)


def test_nested_identity_settings_fail_at_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_SAMPLER_IDENTITY__TRUST_FILE", "/etc/sapo/trust.yaml")
    with pytest.raises(ConfigError, match=r"SAPO_SAMPLER_IDENTITY.*set IDENTITY__MODE=strict"):
        load_settings(SamplerSettings, node_id="n")
    monkeypatch.setenv("SAPO_SAMPLER_IDENTITY__MODE", "strict")
    assert load_settings(SamplerSettings, node_id="n").identity.trust_file == Path("/etc/sapo/trust.yaml")


def test_lazy_verification_reaches_the_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_SAMPLER_VERIFY", "lazy")
    assert load_settings(SamplerSettings, node_id="n").screen_config().verify is VerifyMode.LAZY


def test_unreachable_j_is_reported_with_what_to_set() -> None:
    short = SamplerSettings(node_id="n", external_groups=4, expected_peers=1, max_per_source=2)
    message = short.external_shortfall()
    assert message is not None and "SAPO_SAMPLER_MAX_PER_SOURCE >= 4" in message
    assert SamplerSettings(node_id="n", external_groups=6, expected_peers=3).external_shortfall() is None
    asynchronous = SamplerSettings(node_id="n", external_groups=4, expected_peers=1, round_mode="async")
    message = asynchronous.external_shortfall()
    assert message is not None and "at most 2 external groups, the rest local" in message
    alone = SamplerSettings(node_id="n", external_groups=4, expected_peers=0, round_mode="async")
    message = alone.external_shortfall()
    assert message is not None and "set SAPO_SAMPLER_EXPECTED_PEERS" in message


def test_accepted_configs_are_the_profiles_digests_and_the_allow_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = "ab" * 32
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "node-0")
    monkeypatch.setenv("SAPO_SAMPLER_ACCEPTED_PROFILES", '["easy:basic_arithmetic"]')
    monkeypatch.setenv("SAPO_SAMPLER_ACCEPTED_CONFIG_DIGESTS", f'["{extra}"]')
    s = load_settings(SamplerSettings)
    stream = TaskStream(load_profile("easy:basic_arithmetic"), node_seed=3, split="train")
    digest = stream.take(1)[0].provenance.config_digest  # what a peer's generator puts on the wire
    assert s.screen_config().accepted_configs == {digest, extra}
    monkeypatch.delenv("SAPO_SAMPLER_ACCEPTED_PROFILES")
    monkeypatch.delenv("SAPO_SAMPLER_ACCEPTED_CONFIG_DIGESTS")
    assert config_digests(EASY_PROFILE) <= SamplerSettings(node_id="n").accepted_configs()
    assert config_digests(PAPER_PROFILE) <= SamplerSettings(node_id="n").accepted_configs()


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ACCEPTED_PROFILES", "[]", "SAPO_SAMPLER_ACCEPTED_PROFILES is empty"),
        ("ACCEPTED_PROFILES", '["no-such-profile"]', "neither a built-in profile"),
        ("ACCEPTED_CONFIG_DIGESTS", '["not-a-digest"]', "64 lower-case hex digits"),
    ],
)
def test_bad_accepted_configs_fail_at_start_saying_what_to_set(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "node-0")
    monkeypatch.setenv(f"SAPO_SAMPLER_{name}", value)
    with pytest.raises(ConfigError, match=says):
        load_settings(SamplerSettings)
