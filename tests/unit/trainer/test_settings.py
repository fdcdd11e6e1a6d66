"""Trainer settings: env names, defaults that match the paper, combinations that fail with what to set."""

from __future__ import annotations

import pytest

from sapo.settings import ConfigError, load_settings
from sapo.trainer.settings import TrainerSettings

pytestmark = pytest.mark.unit


def test_env_names_and_nested_consumer_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_TRAINER_NODE_ID", "node-3")
    monkeypatch.setenv("SAPO_TRAINER_LR", "3e-6")
    monkeypatch.setenv("SAPO_TRAINER_EXTERNAL_LOGPROBS", "sender")
    monkeypatch.setenv("SAPO_TRAINER_CONSUMER__SESSION_TIMEOUT_MS", "6000")
    settings = load_settings(TrainerSettings)
    assert settings.lr == 3e-6 and settings.external_logprobs == "sender"
    assert settings.consumer.session_timeout_ms == 6000
    step = settings.step_config()
    assert (step.loss.eps_low, step.loss.eps_high, step.loss.beta) == (0.2, 0.28, 0.0)
    assert settings.optim_config().betas == (0.9, 0.999)


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        ({"lr_schedule": "cosine", "warmup_steps": 10}, "SAPO_TRAINER_TOTAL_STEPS"),
        ({"total_steps": 100}, "SAPO_TRAINER_LR_SCHEDULE=cosine"),
        ({"step_max_silence_s": 2000}, "SAPO_TRAINER_CONSUMER__MAX_POLL_INTERVAL_MS"),
        ({"idle_max_silence_s": 120, "step_max_silence_s": 60}, "SAPO_TRAINER_STEP_MAX_SILENCE_S"),
        ({"lr": 0}, "SAPO_TRAINER_LR"),
        ({"precision": "fp16"}, "SAPO_TRAINER_PRECISION"),
    ],
)
def test_invalid_combinations_say_what_to_set(overrides: dict[str, object], fix: str) -> None:
    with pytest.raises(ConfigError, match=fix):
        load_settings(TrainerSettings, node_id="node-3", **overrides)


def test_sampling_temperature_defaults_to_the_generators_temperature() -> None:
    """A node configured with neither setting scores peers' rows at the temperature it samples at."""
    from sapo.generator.settings import GeneratorSettings

    trainer = load_settings(TrainerSettings, node_id="node-3")
    generator = load_settings(GeneratorSettings, node_id="node-3")
    assert trainer.sampling_temperature == generator.temperature
    assert TrainerSettings.model_fields["sampling_temperature"].metadata == (
        GeneratorSettings.model_fields["temperature"].metadata
    )


@pytest.mark.parametrize("ref", ["tiny:abc", "warm:1:64x2", "bundled:smollm2", "tiny:"])
def test_a_model_reference_of_the_wrong_form_fails_with_the_settings(
    monkeypatch: pytest.MonkeyPatch, ref: str
) -> None:
    monkeypatch.setenv("SAPO_TRAINER_NODE_ID", "node-3")
    monkeypatch.setenv("SAPO_TRAINER_MODEL", ref)
    with pytest.raises(
        ConfigError, match=r"  SAPO_TRAINER_MODEL: Value error, (bad \w+ model reference|unknown bundled)"
    ):
        load_settings(TrainerSettings)
    monkeypatch.setenv("SAPO_TRAINER_MODEL", "tiny:3:64x2")
    assert load_settings(TrainerSettings).model == "tiny:3:64x2"
