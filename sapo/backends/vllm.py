"""Sampling with vLLM (the GPU path): a thin adapter from ``vllm.LLM`` to ``GenerationBackend``.

**Status: this module has not been run against a real vLLM.** vLLM is not installable on the CPU
machines this project is developed on (it is the ``gpu`` extra). The mapping below follows vLLM's
documented offline API and is unit-tested against a fake engine that mimics its output classes
(``RequestOutput.outputs[i]`` with ``token_ids``, ``text``, ``logprobs``, ``finish_reason``). Run the
``gpu`` tests on a GPU machine before relying on it.

Mapping:

- One ``LLM.generate`` call per batch: B token prompts (``{"prompt_token_ids": ids}``) with one
  ``SamplingParams`` each: ``n=L``, ``temperature``, ``top_p``, ``max_tokens``, ``stop``,
  ``include_stop_str_in_output=True`` (our contract keeps stop strings in the text), ``logprobs=0`` (only
  the sampled token's logprob) and a per-prompt seed derived from the batch seed, so prompts in one
  batch do not share a random stream.
- Logprobs: the engine must run with ``logprobs_mode="processed_logprobs"`` (:meth:`from_model_ref`
  sets it): vLLM's default ``raw_logprobs`` ignores the temperature. Processed logprobs are taken after
  temperature *and* after top-k / top-p truncation, while our contract records the tempered full
  distribution (see :mod:`sapo.backends.base`); the two agree only without truncation, so
  :meth:`VLLMBackend.generate` rejects ``top_p < 1`` and ``top_k > 0`` instead of recording logprobs the
  trainer would misread.
- Token ids: ``CompletionOutput.token_ids`` include the EOS token when generation stopped on it, and
  the token that completed a stop string. ``text`` ends at the stop string (vLLM truncates the text, not
  the tokens), so it can be a few characters shorter than ``decode(token_ids)``.
- Finish reasons: vLLM's ``"stop"`` / ``"length"`` map through; anything else (``"abort"``) becomes an
  error sample. Exceptions from the engine itself are not caught: a dead engine must restart the
  generator, not emit error samples forever.
- Weight reload (documented mechanism: a worker extension plus ``LLM.collective_rpc``, as in vLLM's RLHF
  examples): the engine is built with ``worker_extension_cls`` = :class:`WeightLoaderExtension`, whose
  ``sapo_load_weights(path)`` runs in every worker and streams a safetensors file or directory into
  ``model_runner.model.load_weights`` (which takes Hugging Face parameter names). An in-memory state
  dict is first written to a temporary safetensors file because the workers live in other processes.
  The prefix cache is reset afterwards so no KV computed with the old weights is reused.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from huggingface_hub import constants as hf_constants
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from sapo.backends.base import FinishReason, Sample, SamplingConfig, WeightsSource, prompt_seeds, weight_files
from sapo.models.bundled import bundled_model_dir
from sapo.models.loading import require_loadable
from sapo.models.refs import BUNDLED_REF, ref_kind

_EXTENSION = "sapo.backends.vllm.WeightLoaderExtension"
_RELOAD_METHOD = "sapo_load_weights"


class Engine(Protocol):
    """The part of ``vllm.LLM`` the adapter uses (a fake implements it in tests)."""

    def generate(self, prompts: Any, sampling_params: Any, *, use_tqdm: bool = ...) -> list[Any]: ...

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ...) -> list[Any]: ...

    def reset_prefix_cache(self) -> Any: ...


def _iter_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream ``(name, tensor)`` pairs without materialising the whole checkpoint at once."""
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, handle.get_tensor(name)


class WeightLoaderExtension:
    """Mixed into vLLM's worker class via ``worker_extension_cls``; its methods run inside each worker."""

    model_runner: Any

    def sapo_load_weights(self, path: str) -> None:
        """Load a safetensors file or directory (Hugging Face names) into the running model in place."""
        self.model_runner.model.load_weights(weights=_iter_tensors(Path(path)))


def _finish_reason(reason: str | None) -> FinishReason | None:
    """vLLM's finish reason in our vocabulary; ``None`` for anything that is not a normal end."""
    return reason if reason in ("stop", "length") else None  # type: ignore[return-value]


def _to_sample(output: Any) -> Sample:
    """One ``CompletionOutput`` as a :class:`Sample`."""
    reason = _finish_reason(output.finish_reason)
    if reason is None:
        return Sample.failed(f"vLLM finished the completion with reason {output.finish_reason!r}")
    token_ids = tuple(int(t) for t in output.token_ids)
    if output.logprobs is None:
        raise RuntimeError("vLLM returned no logprobs although logprobs=0 was requested")
    logprobs = tuple(float(step[t].logprob) for step, t in zip(output.logprobs, token_ids, strict=True))
    return Sample(text=output.text, token_ids=token_ids, logprobs=logprobs, finish_reason=reason)


class VLLMBackend:
    """:class:`~sapo.backends.base.GenerationBackend` over an (injected) ``vllm.LLM``-like engine.

    ``sampling_params`` builds one request's parameters (``vllm.SamplingParams`` in production, any
    callable taking the same keyword arguments in tests).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        sampling_params: Callable[..., Any],
        *,
        model_version: int = 0,
    ) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._sampling_params = sampling_params
        self._version = model_version

    @classmethod
    def from_model_ref(cls, model_ref: str, **llm_kwargs: Any) -> VLLMBackend:
        """Start a ``vllm.LLM`` for an HF id, a local path or the bundled model (extra kwargs go to it)."""
        from vllm import LLM, SamplingParams  # the gpu extra; absent on CPU installs

        if ref_kind(model_ref) in ("tiny", "tiny-bpe"):
            raise ValueError("tiny models exist only in memory; use the transformers backend for them")
        path = str(bundled_model_dir()) if model_ref == BUNDLED_REF else model_ref
        if hf_constants.HF_HUB_OFFLINE:  # vLLM would fail deep in its engine start instead
            require_loadable(model_ref)
        engine = LLM(
            model=path, logprobs_mode="processed_logprobs", worker_extension_cls=_EXTENSION, **llm_kwargs
        )
        return cls(engine, engine.get_tokenizer(), SamplingParams)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def model_version(self) -> int:
        return self._version

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingConfig,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        if params.quantization:
            raise ValueError(
                f"the vLLM backend samples with the policy's own weights, not {params.quantization!r}"
            )
        if params.top_p < 1 or params.top_k > 0:
            raise ValueError(
                "the vLLM backend records logprobs after top-p/top-k truncation, but the wire contract "
                "needs the tempered full-vocabulary logprob: use top_p=1 and top_k=0 with vLLM, or the "
                "transformers backend"
            )
        if not prompts:
            return []
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        per_prompt = prompt_seeds(params, len(prompts), seeds)
        request_seeds: list[int | None] = (
            list(per_prompt) if per_prompt is not None else [None] * len(prompts)
        )
        sampling = [self._request_params(params, seed) for seed in request_seeds]
        results = self._engine.generate(requests, sampling, use_tqdm=False)
        return [[_to_sample(o) for o in sorted(r.outputs, key=lambda o: o.index)] for r in results]

    def _request_params(self, params: SamplingConfig, seed: int | None) -> Any:
        return self._sampling_params(
            n=params.num_samples,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop),
            include_stop_str_in_output=True,
            logprobs=0,
            seed=seed,
        )

    def load_weights(self, weights: WeightsSource, version: int, *, owned: bool = False) -> None:
        """Stream new weights into every worker, then drop KV prefixes computed with the old ones."""
        if isinstance(weights, Mapping):
            with tempfile.TemporaryDirectory(prefix="sapo-weights-") as tmp:
                file = Path(tmp) / "model.safetensors"
                # Copies: safetensors refuses tensors that share storage (tied embeddings).
                save_file({k: v.detach().to("cpu", copy=True) for k, v in weights.items()}, str(file))
                self._engine.collective_rpc(_RELOAD_METHOD, args=(str(file),))
        else:
            weight_files(Path(weights))  # fail here, not in a worker, on a wrong path
            self._engine.collective_rpc(_RELOAD_METHOD, args=(str(Path(weights)),))
        self._engine.reset_prefix_cache()
        self._version = version
