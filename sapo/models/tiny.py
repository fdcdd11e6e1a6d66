"""Tiny randomly initialised Llama models for tests, fast profiles and heterogeneous test swarms.

Same architecture family as SmolLM2 (LlamaForCausalLM, tied embeddings, grouped-query attention) and the
same tokenizer (``tiny:``) or the project's BPE tokenizer (``tiny-bpe:``, :mod:`sapo.models.bpe`), so
chat templates, special tokens and tokenizer fingerprints are real; only the weights are random.
Weights are a pure function of ``(seed, spec)`` and the tokenizer: two processes building ``tiny:3``
get bit-identical models, and different seeds or sizes give different policies.

The default ``initializer_range`` is larger than the usual 0.02: with 0.02 the next-token
distribution is almost uniform over the 49k vocabulary and barely depends on the context, which would
make tests of logprobs and positions vacuous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from sapo.models.refs import TINY_REF


@dataclass(frozen=True)
class TinySpec:
    """Size of a tiny model. ``hidden_size`` must be divisible by ``num_attention_heads``."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    initializer_range: float = 0.2
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; pick a multiple"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def parse_tiny_ref(model_ref: str) -> tuple[int, TinySpec]:
    """Parse ``tiny:<seed>`` or ``tiny:<seed>:<hidden>x<layers>`` into a seed and a spec; ``tiny-bpe:``
    takes the same form (the kind only picks the tokenizer, see ``sapo.models.tokenizer``).

    The size suffix lets a swarm manifest ask for differently sized tiny nodes without code.
    """
    match = TINY_REF.fullmatch(model_ref)
    if match is None:
        kind = "tiny-bpe" if model_ref.startswith("tiny-bpe:") else "tiny"
        raise ValueError(
            f"bad tiny model reference {model_ref!r}; use {kind}:<seed> or {kind}:<seed>:<hidden>x<layers>"
        )
    seed = int(match["seed"])
    if match["hidden"] is None:
        return seed, TinySpec()
    hidden = int(match["hidden"])
    heads = max(1, hidden // 16)
    spec = TinySpec(
        hidden_size=hidden,
        num_hidden_layers=int(match["layers"]),
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
        intermediate_size=2 * hidden,
    )
    return seed, spec


def tiny_config(tokenizer: PreTrainedTokenizerBase, spec: TinySpec) -> LlamaConfig:
    """Llama config of a tiny model whose vocabulary and special ids come from ``tokenizer``."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, seed: int = 0, spec: TinySpec | None = None
) -> LlamaForCausalLM:
    """A tiny random fp32 Llama, deterministic in ``(seed, spec)``; the global RNG is left untouched."""
    config = tiny_config(tokenizer, spec or TinySpec())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model
