"""The sampling-backend interface shared by the transformers (CPU) and vLLM (GPU) generators.

A backend turns B tokenized prompts into B x L sampled completions (:class:`Sample`) and can swap in new
policy weights between batches. Its output maps one-to-one onto ``sapo.v1.Completion``.

Logprob convention (the wire contract): ``Sample.logprobs[i]`` is the natural-log probability of
``token_ids[i]`` under ``softmax(logits / temperature)`` over the *full* vocabulary, given the prompt and
the previous completion tokens. Top-k / top-p truncation changes the distribution tokens are actually
drawn from, but it is not reflected in the logprob: the trainer compares these numbers with its own
``log_softmax(logits / temperature)``, which never truncates, so recording the tempered full
distribution keeps the importance ratio exactly 1 for an unchanged policy. With the paper's settings
(top-p 1, top-k off) both distributions coincide.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeAlias, runtime_checkable

import torch
from transformers import PreTrainedTokenizerBase

FinishReason: TypeAlias = Literal["stop", "length", "error"]
"""Why a completion ended: EOS token or stop string, ``max_new_tokens``, or a generation failure."""

WeightsSource: TypeAlias = Mapping[str, torch.Tensor] | str | os.PathLike[str]
"""New policy weights: an in-memory state dict, a ``.safetensors`` file or a directory of them."""


def weight_files(path: Path) -> list[Path]:
    """The ``.safetensors`` file at ``path``, or every one in the directory ``path`` (shards), sorted."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        raise FileNotFoundError(f"no .safetensors file at {path}")
    return files


@dataclass(frozen=True)
class Sample:
    """One sampled completion o_i of a prompt.

    ``token_ids`` ends with the EOS / stop-string token when ``finish_reason == "stop"``: that token is
    part of what the policy chose, so it is trained on. ``len(logprobs) == len(token_ids)``. A failed
    generation has ``finish_reason == "error"``, a non-empty ``error`` and must never be scored (not even
    as 0) or trained on.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    error: str = ""

    def __post_init__(self) -> None:
        if self.logprobs and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.token_ids)} tokens")
        if (self.finish_reason == "error") != bool(self.error):
            raise ValueError("error must be set exactly when finish_reason is 'error'")

    @classmethod
    def failed(cls, error: str) -> Sample:
        """A placeholder for a completion whose generation raised."""
        return cls(text="", token_ids=(), logprobs=(), finish_reason="error", error=error or "unknown error")


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one batch (mirrors ``sapo.v1.SamplingParams`` plus the group size L).

    ``seed`` makes a batch reproducible (``None``: not reseeded): prompt i is sampled with seed
    ``derive_seed(seed, i)`` unless the caller gives every prompt its own seed (``generate(seeds=)``).
    ``stop`` strings end a completion early; they are matched on the generated text only and kept in it.
    """

    max_new_tokens: int
    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    #: How the backend's sampling weights approximate the policy ("" = its own weights; see
    #: `sapo.backends.hf.QUANTIZATIONS`); a backend refuses a value other than its own.
    quantization: str = ""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples (L) must be >= 1, got {self.num_samples}")
        if not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 (greedy decoding has no logprobs), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        object.__setattr__(self, "stop", tuple(self.stop))  # hashable even if a list was passed
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


def derive_seed(seed: int, index: int) -> int:
    """Independent 63-bit seed number ``index`` under ``seed``."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sample_seed(prompt_seed: int, sample: int) -> int:
    """The seed of completion number ``sample`` of a prompt sampled with ``prompt_seed``."""
    return derive_seed(prompt_seed, sample)


def prompt_seeds(params: SamplingConfig, prompts: int, seeds: Sequence[int] | None) -> list[int] | None:
    """Each prompt's seed: the caller's, else derived from the batch seed, else None (unseeded)."""
    if seeds is not None:
        if len(seeds) != prompts:
            raise ValueError(f"{len(seeds)} seeds for {prompts} prompts")
        return list(seeds)
    if params.seed is None:
        return None
    return [derive_seed(params.seed, i) for i in range(prompts)]


@runtime_checkable
class GenerationBackend(Protocol):
    """Samples completions from the current policy; weights can be swapped between batches."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer (prompts passed to :meth:`generate` are encoded with it)."""
        ...

    @property
    def model_version(self) -> int:
        """Policy version of the loaded weights (0 = initial weights)."""
        ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingConfig,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        """Sample ``params.num_samples`` completions for each prompt: B lists of L samples, prompt order.

        Prompts are token ids exactly as the model should see them (chat template applied, no padding).
        ``seeds`` gives each prompt its own seed (see `prompt_seeds`): a prompt's completions then
        depend on its seed and the weights, not on the other prompts of the call. Failures of the
        generation itself come back as ``Sample.failed`` entries, not exceptions.
        """
        ...

    def load_weights(self, weights: WeightsSource, version: int, *, owned: bool = False) -> None:
        """Replace the policy weights (same architecture) and record ``version`` as the model version.

        ``owned``: the caller hands the tensors over (a checkpoint buffer it just verified), so a backend
        may make them its weights instead of copying them.
        """
        ...
