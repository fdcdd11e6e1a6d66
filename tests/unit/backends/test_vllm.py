"""vLLM adapter against a fake engine that mimics vLLM's offline API and output classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from sapo.backends import GenerationBackend, SamplingConfig, VLLMBackend
from sapo.backends.base import derive_seed
from sapo.backends.vllm import WeightLoaderExtension

pytestmark = pytest.mark.unit

EOS = 2


@dataclass
class Logprob:
    """vllm.logprobs.Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """vllm.outputs.CompletionOutput (the fields the adapter reads)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """vllm.outputs.RequestOutput."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class FakeLLM:
    """Answers completion j of a prompt with j+1 tokens; the last completion is aborted.

    Completion 0 stops on EOS, the others run to the length limit, mirroring what vLLM reports.
    """

    calls: list[tuple[list[dict[str, list[int]]], list[dict[str, Any]]]] = field(default_factory=list)
    rpcs: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    loaded: list[dict[str, torch.Tensor]] = field(default_factory=list)
    prefix_resets: int = 0

    def generate(self, prompts: Any, sampling_params: Any, *, use_tqdm: bool = True) -> list[Any]:
        self.calls.append((prompts, sampling_params))
        return [self._answer(i, p, s) for i, (p, s) in enumerate(zip(prompts, sampling_params, strict=True))]

    def _answer(self, i: int, prompt: dict[str, list[int]], params: dict[str, Any]) -> RequestOutput:
        outputs = []
        for j in reversed(range(params["n"])):  # vLLM does not promise index order
            tokens = [100 + k for k in range(j)] + [EOS if j == 0 else 200]
            reason = "abort" if j == params["n"] - 1 and j > 0 else ("stop" if j == 0 else "length")
            steps = [{t: Logprob(-0.5 * (k + 1)), 7: Logprob(-9.0)} for k, t in enumerate(tokens)]
            outputs.append(CompletionOutput(j, f"p{i}c{j}", tokens, None, steps, reason))
        return RequestOutput(f"req-{i}", prompt["prompt_token_ids"], outputs)

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.rpcs.append((method, args))
        self.loaded.append(load_file(args[0]) if Path(args[0]).is_file() else {})
        return [None]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


def make_params(**kwargs: Any) -> dict[str, Any]:
    """Stands in for vllm.SamplingParams: records the keyword arguments."""
    return kwargs


@pytest.fixture
def engine() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def vllm_backend(engine: FakeLLM, tokenizer: PreTrainedTokenizerBase) -> VLLMBackend:
    return VLLMBackend(engine, tokenizer, make_params)


def test_adapter_satisfies_the_protocol(vllm_backend: VLLMBackend) -> None:
    assert isinstance(vllm_backend, GenerationBackend)


def test_one_engine_call_with_per_prompt_params(vllm_backend: VLLMBackend, engine: FakeLLM) -> None:
    params = SamplingConfig(max_new_tokens=16, num_samples=3, temperature=0.8, seed=9, stop=("</answer>",))
    vllm_backend.generate([[1, 2, 3], [4, 5]], params)
    assert len(engine.calls) == 1
    prompts, sampling = engine.calls[0]
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    assert sampling[0] == {
        "n": 3,
        "temperature": 0.8,
        "top_p": 1.0,
        "max_tokens": 16,
        "stop": ["</answer>"],
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "seed": derive_seed(9, 0),
    }
    assert sampling[0]["seed"] != sampling[1]["seed"]


def test_outputs_map_to_samples_in_index_order(vllm_backend: VLLMBackend) -> None:
    groups = vllm_backend.generate([[1, 2, 3], [4, 5]], SamplingConfig(max_new_tokens=8, num_samples=3))
    assert [len(g) for g in groups] == [3, 3]
    first, second, aborted = groups[1]
    assert first.token_ids == (EOS,) and first.finish_reason == "stop" and first.text == "p1c0"
    assert second.token_ids == (100, 200) and second.finish_reason == "length"
    assert second.logprobs == (-0.5, -1.0)  # the chosen token's entry, not the other top-k entry
    assert aborted.finish_reason == "error" and "abort" in aborted.error


def test_missing_logprobs_is_a_configuration_error(tokenizer: PreTrainedTokenizerBase) -> None:
    class NoLogprobs(FakeLLM):
        def _answer(self, i: int, prompt: dict[str, list[int]], params: dict[str, Any]) -> RequestOutput:
            out = CompletionOutput(0, "x", [5, EOS], None, None, "stop")
            return RequestOutput(f"req-{i}", prompt["prompt_token_ids"], [out])

    backend = VLLMBackend(NoLogprobs(), tokenizer, make_params)
    with pytest.raises(RuntimeError, match="no logprobs"):
        backend.generate([[1]], SamplingConfig(max_new_tokens=2))


@pytest.mark.parametrize("truncation", [{"top_p": 0.9}, {"top_k": 20}])
def test_truncated_sampling_is_rejected(vllm_backend: VLLMBackend, truncation: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="full-vocabulary"):
        vllm_backend.generate([[1]], SamplingConfig(max_new_tokens=2, **truncation))


def test_state_dict_reload_goes_through_a_safetensors_file(
    vllm_backend: VLLMBackend, engine: FakeLLM
) -> None:
    embed = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed}  # tied: shares storage
    vllm_backend.load_weights(state, version=4)
    assert engine.rpcs[0][0] == "sapo_load_weights"
    assert not Path(engine.rpcs[0][1][0]).exists()  # the temporary file is cleaned up
    torch.testing.assert_close(engine.loaded[0]["lm_head.weight"], embed)
    assert engine.prefix_resets == 1
    assert vllm_backend.model_version == 4


def test_path_reload_is_passed_to_the_workers(
    vllm_backend: VLLMBackend, engine: FakeLLM, tmp_path: Path
) -> None:
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    vllm_backend.load_weights(tmp_path, version=2)
    assert engine.rpcs == [("sapo_load_weights", (str(tmp_path),))]
    assert engine.prefix_resets == 1
    with pytest.raises(FileNotFoundError):
        vllm_backend.load_weights(tmp_path / "nowhere", version=3)
    assert vllm_backend.model_version == 2


def test_worker_extension_streams_named_tensors(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2)}, str(tmp_path / "model-1.safetensors"))
    save_file({"b": torch.zeros(3)}, str(tmp_path / "model-2.safetensors"))
    received: dict[str, torch.Tensor] = {}

    class Model:
        def load_weights(self, weights: Any) -> None:
            received.update(weights)

    worker = WeightLoaderExtension()
    worker.model_runner = type("Runner", (), {"model": Model()})()
    worker.sapo_load_weights(str(tmp_path))
    assert sorted(received) == ["a", "b"]


def test_derived_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(1, 0) == derive_seed(1, 0)
    seeds = {derive_seed(s, i) for s in range(4) for i in range(4)}
    assert len(seeds) == 16 and all(0 <= s < 2**63 for s in seeds)
