"""Tiny random models: deterministic in (seed, spec), real tokenizer, sizes from the model reference."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.models import TinySpec, build_tiny_model, load_model, parse_tiny_ref

pytestmark = pytest.mark.unit


def test_same_seed_same_weights_different_seed_different(tokenizer: PreTrainedTokenizerBase) -> None:
    rng_before = torch.get_rng_state()
    a, b, c = (build_tiny_model(tokenizer, seed=s).state_dict() for s in (3, 3, 4))
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"])


def test_load_model_tiny_ref_is_ready_for_chat() -> None:
    model, tokenizer = load_model("tiny:0")
    assert not model.training
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str) and text.endswith("<|im_start|>assistant\n")


def test_size_suffix_builds_a_different_architecture() -> None:
    seed, spec = parse_tiny_ref("tiny:7:128x3")
    assert seed == 7
    assert (spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads) == (128, 3, 8)
    model, _ = load_model("tiny:7:128x3")
    assert model.config.hidden_size == 128 and model.config.num_hidden_layers == 3


def test_default_spec_and_bad_refs() -> None:
    assert parse_tiny_ref("tiny:12") == (12, TinySpec())
    for bad in ("tiny:", "tiny:x", "tiny:1:64", "tiny:-1"):
        with pytest.raises(ValueError, match="tiny:<seed>"):
            parse_tiny_ref(bad)
    with pytest.raises(ValueError, match="divisible"):
        TinySpec(hidden_size=60, num_attention_heads=8)


def test_dtype_is_applied() -> None:
    model, _ = load_model("tiny:1", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
