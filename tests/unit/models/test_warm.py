"""Warm-started tiny models: reference parsing, deterministic SFT, the cache, and generator-exact prompts.

The fast tests use a 32-wide one-layer model and a handful of steps (about a second each); the default
recipe's reward band is checked by the slow test and measured by bench/calibrate_warm.py.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.backends import SamplingConfig, TransformersBackend
from sapo.generator import RoundPrompt
from sapo.models import (
    WarmRecipe,
    build_tiny_model,
    bundled_tokenizer_dir,
    load_model,
    parse_warm_ref,
    train_warm_model,
)
from sapo.models.cache import CACHE_ENV
from sapo.models.warm import DEFAULT_SPEC, DEFAULT_STEPS, WARM_PROFILE, answer_loss, sft_example, sft_stream
from sapo.tasks import (
    ANSWER_PREFILL,
    STOP_STRINGS,
    TaskStream,
    encode_prompt,
    prompt_ids,
    render_prompt,
    score,
)

pytestmark = pytest.mark.unit

SMALL_REF = "warm:1:32x1:2"


def small_recipe(steps: int = 4) -> WarmRecipe:
    """A recipe that trains in about a second: 32 wide, one layer, 4 questions per step, no warm-up."""
    _, recipe = parse_warm_ref(f"warm:1:32x1:{steps}")
    return dataclasses.replace(recipe, batch_size=4, warmup_steps=0, learning_rate=3e-2)


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_references_parse_into_recipes() -> None:
    assert parse_warm_ref("warm:7") == (7, WarmRecipe())
    assert parse_warm_ref(f"warm:7:64x2:{DEFAULT_STEPS}") == parse_warm_ref("warm:7")  # default spelled out
    seed, recipe = parse_warm_ref("warm:3:128x3:50")
    assert seed == 3 and recipe.steps == 50
    spec = recipe.spec
    assert (spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads) == (128, 3, 8)
    assert spec.initializer_range == DEFAULT_SPEC.initializer_range  # the warm init, not tiny's 0.2
    for bad in ("warm:", "warm:x", "warm:1:64x2", "warm:1:64:10", "warm:-1", "tiny:1"):
        with pytest.raises(ValueError, match="warm:<seed>"):
            parse_warm_ref(bad)
    with pytest.raises(ValueError, match="learning_rate"):
        WarmRecipe(learning_rate=0.0)


def test_prompts_are_exactly_what_the_generator_feeds(tokenizer: PreTrainedTokenizerBase) -> None:
    planned = [RoundPrompt(r, prompt_ids(tokenizer, r)) for r in sft_stream(5).take(12)]  # as generate_items
    examples = [sft_example(tokenizer, record) for record in sft_stream(5).take(12)]
    assert {e.record.task for e in examples} == {spec.name for spec in WARM_PROFILE}
    for plan, example in zip(planned, examples, strict=True):
        assert example.record == plan.record
        assert example.prompt_ids == plan.prompt_ids
        rendered = render_prompt(tokenizer, example.record)
        assert rendered.endswith(ANSWER_PREFILL)
        assert example.prompt_ids == encode_prompt(tokenizer, rendered)
        assert tokenizer.decode(list(example.prompt_ids)) == rendered
        target = tokenizer.decode(list(example.target_ids))
        assert target == f"{example.record.answer}</answer>{tokenizer.eos_token}"
        assert example.target_ids[-1] == tokenizer.eos_token_id


def test_sft_data_comes_from_the_train_split_only() -> None:
    records = sft_stream(0).take(32)
    assert all(r.provenance.split == "train" for r in records)
    held_out = {r.text for r in TaskStream(WARM_PROFILE, 0, "eval").take(200)}
    assert not held_out & {r.text for r in sft_stream(0).take(400)}


def test_building_is_deterministic_per_seed(tokenizer: PreTrainedTokenizerBase) -> None:
    rng_before = torch.get_rng_state()
    first = train_warm_model(tokenizer, 1, small_recipe()).state_dict()
    second = train_warm_model(tokenizer, 1, small_recipe()).state_dict()
    other = train_warm_model(tokenizer, 2, small_recipe()).state_dict()
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert same_weights(first, second)
    assert not same_weights(first, other)


def test_a_longer_recipe_passes_through_the_shorter_one(tokenizer: PreTrainedTokenizerBase) -> None:
    """Constant learning rate after warm-up: step k of a long run is the k-step recipe (calibration)."""
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def keep(step: int, model: torch.nn.Module, loss: float) -> None:
        snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}

    train_warm_model(tokenizer, 1, small_recipe(4), callback=keep)
    assert same_weights(snapshots[2], train_warm_model(tokenizer, 1, small_recipe(2)).state_dict())


def test_sft_reduces_the_answer_loss(tokenizer: PreTrainedTokenizerBase) -> None:
    recipe = small_recipe(5)
    unseen = [sft_example(tokenizer, r) for r in sft_stream(99).take(8)]  # another seed's questions
    before = answer_loss(build_tiny_model(tokenizer, seed=1, spec=recipe.spec), unseen)
    after = answer_loss(train_warm_model(tokenizer, 1, recipe), unseen)
    assert before > 10  # ~ln(49152): the random init knows nothing
    assert after < before - 2  # measured 10.8 -> 4.5: the format tokens are learned first


def test_cached_load_returns_the_built_weights(
    tokenizer: PreTrainedTokenizerBase,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    forbid_warm_training: Callable[[], None],
) -> None:
    tokenizer_dir = bundled_tokenizer_dir()  # reuse the extracted tokenizer in the temporary cache
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    linked = tmp_path / "bundled" / tokenizer_dir.parent.name / "tokenizer"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(tokenizer_dir, target_is_directory=True)

    seed, recipe = parse_warm_ref(SMALL_REF)
    expected = train_warm_model(tokenizer, seed, recipe).state_dict()
    built, built_tokenizer = load_model(SMALL_REF)
    forbid_warm_training()
    cached, _ = load_model(SMALL_REF)
    entries = sorted((tmp_path / "warm").iterdir())
    assert len(entries) == 2 and entries[0].name.startswith("warm-1-32x1-2-")  # the entry and its lock
    assert entries[1].name == entries[0].name + ".lock"
    assert same_weights(built.state_dict(), expected)
    assert same_weights(cached.state_dict(), expected)
    assert not cached.training and cached.dtype == torch.float32
    assert built_tokenizer.get_vocab() == tokenizer.get_vocab()


@pytest.mark.slow
def test_default_recipe_starts_in_the_useful_reward_band(tokenizer: PreTrainedTokenizerBase) -> None:
    """Pre-RL reward at T=1.0 between 0.05 and 0.5 on train and held-out questions (~1.5 min on one core)."""
    model = train_warm_model(tokenizer, 0, WarmRecipe())
    backend = TransformersBackend(model, tokenizer)
    params = SamplingConfig(max_new_tokens=24, num_samples=4, temperature=1.0, seed=7, stop=STOP_STRINGS)
    means = {}
    for split in ("train", "eval"):
        records = TaskStream(WARM_PROFILE, 0, split).take(48)
        prompts = [prompt_ids(tokenizer, r) for r in records]
        groups = backend.generate(prompts, params)
        rewards = [score(r, s.text, prefilled=True) for r, g in zip(records, groups, strict=True) for s in g]
        means[split] = statistics.fmean(rewards)
    assert 0.05 < means["train"] < 0.5, means
    assert 0.05 < means["eval"] < 0.5, means
    assert abs(means["train"] - means["eval"]) < 0.15, means
