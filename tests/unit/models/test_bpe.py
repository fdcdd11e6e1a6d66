"""The project's BPE tokenizer and its model references (``tiny-bpe:``, ``warm-bpe:``).

The tokenizer: deterministic, byte-level (any text round-trips), the special tokens and chat template the
prompt rendering, generation and training rely on, and a fingerprint of its own. The references: parsed
like their bundled-tokenizer twins, loaded with the BPE tokenizer, cached under names of their own,
while ``warm:`` cache names keep exactly the inputs they had before the second family existed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.generator import RoundPrompt
from sapo.models import (
    PROJECT_REF_KINDS,
    WarmRecipe,
    build_tiny_model,
    is_project_ref,
    load_model,
    parse_tiny_ref,
    parse_warm_ref,
    project_tokenizer,
    ref_kind,
    tokenizer_fingerprint,
    train_warm_model,
)
from sapo.models.bpe import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    bpe_corpus,
    bpe_tokenizer_dir,
    train_bpe_tokenizer,
)
from sapo.models.cache import CACHE_ENV
from sapo.models.warm import RECIPE_VERSION, _cache_name, answer_loss, sft_example, sft_stream
from sapo.tasks import (
    ANSWER_PREFILL,
    EASY_PROFILE,
    GENERATOR_VERSION,
    SYSTEM_PROMPT,
    TaskStream,
    encode_prompt,
    prompt_ids,
    render_prompt,
)

pytestmark = pytest.mark.unit

TEXTS = (
    "",
    "plain words, punctuation; and 0123456789",
    "  leading and trailing spaces \t\n\n",
    "(P ∧ Q) → ¬R ↔ S ∨ T",
    "héllo 日本語 🙂 \x00\x7f",
    "<answer>2023-05-01</answer>",
    "Tuesday</answer> garbage </ans",
)


def test_a_fresh_build_equals_the_cached_tokenizer(bpe_tokenizer: PreTrainedTokenizerBase) -> None:
    """Deterministic: the cache is usually built by another process (with another hash seed), and
    nodes on other machines build their own copy; all must agree on every id (one fingerprint)."""
    fresh = train_bpe_tokenizer(bpe_corpus())
    assert fresh.backend_tokenizer.to_str() == bpe_tokenizer.backend_tokenizer.to_str()
    assert tokenizer_fingerprint(fresh) == tokenizer_fingerprint(bpe_tokenizer)
    assert fresh.chat_template == bpe_tokenizer.chat_template


def test_vocabulary_and_special_tokens(bpe_tokenizer: PreTrainedTokenizerBase) -> None:
    assert len(bpe_tokenizer) == VOCAB_SIZE
    assert bpe_tokenizer.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == list(SPECIAL_TOKENS)
    assert (bpe_tokenizer.pad_token, bpe_tokenizer.bos_token, bpe_tokenizer.eos_token) == (PAD, BOS, EOS)
    assert bpe_tokenizer.pad_token_id != bpe_tokenizer.eos_token_id
    assert bpe_tokenizer.unk_token is None  # byte-level: nothing is ever unknown
    assert tokenizer_fingerprint(bpe_tokenizer) != tokenizer_fingerprint(project_tokenizer("tiny:0"))


@pytest.mark.parametrize("text", TEXTS)
def test_any_text_round_trips(bpe_tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    ids = bpe_tokenizer.encode(text, add_special_tokens=False)
    assert bpe_tokenizer.decode(ids) == text
    assert bpe_tokenizer.decode(ids, skip_special_tokens=True) == text  # "</answer>" is not special
    assert bpe_tokenizer.encode(text) == ids  # no post-processor: the chat template writes BOS


def test_chat_template_renders_the_project_prompt(bpe_tokenizer: PreTrainedTokenizerBase) -> None:
    for record in TaskStream(EASY_PROFILE, 3, "train").take(8):
        rendered = render_prompt(bpe_tokenizer, record)
        assert rendered.startswith(f"{BOS}<|system|>\n{SYSTEM_PROMPT}{EOS}\n<|user|>\n")
        assert rendered.endswith(f"{record.text}{EOS}\n<|assistant|>\n{ANSWER_PREFILL}")
        assert rendered.count("<|assistant|>\n<answer>") == 2  # the worked example's reply, then ours
        ids = encode_prompt(bpe_tokenizer, rendered)
        assert ids[0] == bpe_tokenizer.bos_token_id and ids.count(bpe_tokenizer.bos_token_id) == 1
        assert ids.count(bpe_tokenizer.eos_token_id) == 4  # one per closed turn
        assert bpe_tokenizer.decode(list(ids)) == rendered
    with pytest.raises(Exception, match="roles are system, user and assistant"):
        bpe_tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_sft_examples_use_the_generator_prompt_and_end_in_eos(bpe_tokenizer: PreTrainedTokenizerBase) -> None:
    # The prompts as generate_items builds them:
    planned = [RoundPrompt(r, prompt_ids(bpe_tokenizer, r)) for r in sft_stream(5).take(6)]
    for plan in planned:
        example = sft_example(bpe_tokenizer, plan.record)
        assert example.prompt_ids == plan.prompt_ids
        assert bpe_tokenizer.decode(list(example.target_ids)) == f"{plan.record.answer}</answer>{EOS}"


def test_references_parse_like_their_bundled_twins() -> None:
    assert parse_tiny_ref("tiny-bpe:3") == parse_tiny_ref("tiny:3")
    assert parse_tiny_ref("tiny-bpe:3:128x3") == parse_tiny_ref("tiny:3:128x3")
    assert parse_warm_ref("warm-bpe:4") == parse_warm_ref("warm:4") == (4, WarmRecipe())
    assert parse_warm_ref("warm-bpe:4:32x1:50") == parse_warm_ref("warm:4:32x1:50")
    for bad in ("tiny-bpe:", "tiny-bpe:x", "tiny-bpe:1:64", "tiny-bpe:-1"):
        with pytest.raises(ValueError, match="use tiny-bpe:<seed>"):
            parse_tiny_ref(bad)
    for bad in ("warm-bpe:", "warm-bpe:1:64x2", "warm-bpe:1:64:10"):
        with pytest.raises(ValueError, match="use warm-bpe:<seed>"):
            parse_warm_ref(bad)
    for bad in ("tiny-bpe:1", "warm-bpe1"):
        with pytest.raises(ValueError, match="use warm:<seed>"):
            parse_warm_ref(bad)
    with pytest.raises(ValueError, match="use tiny:<seed>"):
        parse_tiny_ref("tiny-gpt:1")


def test_reference_kinds() -> None:
    assert [ref_kind(r) for r in ("tiny-bpe:1:64x2", "warm:0", "org/model", "bundled:x")] == [
        "tiny-bpe",
        "warm",
        "org/model",
        "bundled",
    ]
    assert all(is_project_ref(f"{kind}:0") for kind in PROJECT_REF_KINDS)
    assert not any(is_project_ref(r) for r in ("bundled:smollm2-135m-instruct", "org/tiny:1", "/tmp/warm"))
    with pytest.raises(ValueError, match="not a project-built"):
        project_tokenizer("org/model")


def test_tiny_bpe_models_load_with_the_bpe_tokenizer(bpe_tokenizer: PreTrainedTokenizerBase) -> None:
    model, tokenizer = load_model("tiny-bpe:2:32x1")
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(bpe_tokenizer)
    assert model.config.vocab_size == VOCAB_SIZE and model.config.hidden_size == 32
    assert (model.config.eos_token_id, model.config.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    expected = build_tiny_model(bpe_tokenizer, seed=2, spec=parse_tiny_ref("tiny:2:32x1")[1]).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    bundled, _ = load_model("tiny:2:32x1")
    assert bundled.config.vocab_size > 40_000  # the bundled-tokenizer twin is untouched


def test_warm_cache_names_keep_their_inputs(
    tokenizer: PreTrainedTokenizerBase, bpe_tokenizer: PreTrainedTokenizerBase
) -> None:
    """`warm:` entries are found under the name they had before `warm-bpe:` existed (built models are
    reused, not rebuilt); `warm-bpe:` gets a name and digest of its own."""
    seed, recipe = parse_warm_ref("warm:0")
    identity = {
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "recipe": dataclasses.asdict(recipe),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "tasks": GENERATOR_VERSION,
        "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers"),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    assert RECIPE_VERSION == 1 and recipe == WarmRecipe()
    assert _cache_name(seed, recipe, tokenizer) == f"warm-0-64x2-300-{digest}"
    bpe_seed, bpe_recipe = parse_warm_ref("warm-bpe:0")
    bpe_name = _cache_name(bpe_seed, bpe_recipe, bpe_tokenizer, "warm-bpe")
    assert bpe_name.startswith("warm-bpe-0-") and not bpe_name.endswith(digest)


def test_warm_bpe_trains_and_caches(
    bpe_tokenizer: PreTrainedTokenizerBase,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    forbid_warm_training: Callable[[], None],
) -> None:
    ref = "warm-bpe:1:32x1:3"
    seed, recipe = parse_warm_ref(ref)
    recipe = dataclasses.replace(recipe, batch_size=4, warmup_steps=0, learning_rate=3e-2)
    unseen = [sft_example(bpe_tokenizer, r) for r in sft_stream(99).take(8)]
    before = answer_loss(build_tiny_model(bpe_tokenizer, seed=seed, spec=recipe.spec), unseen)
    after = answer_loss(train_warm_model(bpe_tokenizer, seed, recipe), unseen)
    assert before > 5  # ~ln(1024)
    assert after < before - 1

    cached_tokenizer = bpe_tokenizer_dir()  # reuse the built tokenizer in the temporary cache
    (tmp_path / "bpe").mkdir()
    (tmp_path / "bpe" / cached_tokenizer.name).symlink_to(cached_tokenizer, target_is_directory=True)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    _, built_tokenizer = load_model(ref)
    forbid_warm_training()
    cached, _ = load_model(ref)
    entries = sorted(p.name for p in (tmp_path / "warm").iterdir())
    assert len(entries) == 2 and entries[0].startswith("warm-bpe-1-32x1-3-")  # the entry and its lock
    expected = train_warm_model(bpe_tokenizer, seed, parse_warm_ref(ref)[1]).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in cached.state_dict().items())
    assert tokenizer_fingerprint(built_tokenizer) == tokenizer_fingerprint(bpe_tokenizer)
