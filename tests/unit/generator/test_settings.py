"""Generator settings: env names and defaults, bounds, cross-field rules that say what to set."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo.backends import TransformersBackend
from sapo.generator import SharingPolicy
from sapo.generator.groups import sampling_params
from sapo.generator.settings import BackendKind, GeneratorSettings
from sapo.models import BUNDLED_REF
from sapo.node.build import build_backend, round_source
from sapo.settings import ConfigError, load_settings
from sapo.tasks import EASY_PROFILE

pytestmark = pytest.mark.unit


def test_defaults_follow_the_paper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_GENERATOR_NODE_ID", "node-3")
    s = load_settings(GeneratorSettings)
    assert s.model == BUNDLED_REF and s.backend is BackendKind.HF
    assert (s.completions_per_question, s.temperature, s.top_p) == (8, 1.0, 1.0)
    assert s.max_new_tokens == 256
    assert s.sharing is SharingPolicy.ALL
    assert s.task_profile() == EASY_PROFILE


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "NODE_ID": "node-3",
        "MODEL": "tiny:4",
        "MAX_BATCH_ITEMS": "2",
        "SHARING": "fraction",
        "SHARE_FRACTION": "0.25",
        "PROFILE": "paper",
    }.items():
        monkeypatch.setenv(f"SAPO_GENERATOR_{name}", value)
    s = load_settings(GeneratorSettings)
    assert (s.model, s.max_batch_items, s.share_fraction) == ("tiny:4", 2, 0.25)
    assert len(s.task_profile()) == 9


def test_node_seed_defaults_to_a_stable_function_of_the_node_id() -> None:
    a1 = GeneratorSettings(node_id="node-a").effective_node_seed
    assert a1 == GeneratorSettings(node_id="node-a").effective_node_seed
    assert a1 != GeneratorSettings(node_id="node-b").effective_node_seed
    assert GeneratorSettings(node_id="node-a", node_seed=5).effective_node_seed == 5


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"sharing": "fraction"}, "SAPO_GENERATOR_SHARE_FRACTION"),
        ({"share_fraction": 0.5}, "SAPO_GENERATOR_SHARING=fraction"),
        ({"backend": "vllm", "model": "tiny:0"}, "SAPO_GENERATOR_BACKEND=hf"),
        ({"backend": "vllm", "model": "warm-bpe:0"}, "SAPO_GENERATOR_BACKEND=hf"),
        ({"backend": "vllm", "model": "tiny-bpe:1"}, "SAPO_GENERATOR_BACKEND=hf"),
        ({"backend": "vllm", "top_p": 0.9}, "SAPO_GENERATOR_TOP_P=1"),
        ({"completions_per_question": 1}, "SAPO_GENERATOR_COMPLETIONS_PER_QUESTION"),
        ({"temperature": 0}, "SAPO_GENERATOR_TEMPERATURE"),
        ({"profile": "hard"}, "neither a built-in profile"),
        ({"device": "gpu"}, "SAPO_GENERATOR_DEVICE"),
        ({"cpu_slice_ms": 150}, "SAPO_GENERATOR_CPU_SLICE_MS"),
        ({"quantization": "int8-dynamic", "dtype": "bfloat16"}, "SAPO_GENERATOR_DTYPE=float32"),
        ({"quantization": "int8-dynamic", "device": "cuda"}, "SAPO_GENERATOR_DEVICE=cpu"),
        ({"quantization": "int4"}, "SAPO_GENERATOR_QUANTIZATION"),
        ({"liveness_timeout_s": 3600}, "SAPO_GENERATOR_CONSUMER__MAX_POLL_INTERVAL_MS"),
    ],
)
def test_invalid_combinations_say_what_to_set(overrides: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(GeneratorSettings, node_id="node-a", **overrides)


def test_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("calendar_arithmetic:\n  weight: 2\n  config: {year: 2023}\npropositional_logic: {}\n")
    s = GeneratorSettings(node_id="node-a", profile=str(path))
    assert [spec.name for spec in s.task_profile()] == ["calendar_arithmetic", "propositional_logic"]
    path.write_text("no_such_task: {}\n")
    with pytest.raises(ConfigError, match="no_such_task"):
        load_settings(GeneratorSettings, node_id="node-a", profile=str(path))


def test_quantized_rollouts_are_declared_on_every_group() -> None:
    settings = load_settings(GeneratorSettings, node_id="node-a", model="tiny:0", quantization="int8-dynamic")
    backend = build_backend(settings)
    source = round_source(settings, backend.tokenizer)
    assert isinstance(backend, TransformersBackend) and backend.quantization == "int8-dynamic"
    assert source.sampling.quantization == "int8-dynamic"
    assert sampling_params(source.sampling, seed=1).quantization == "int8-dynamic"
