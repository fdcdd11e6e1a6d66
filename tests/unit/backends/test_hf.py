"""Transformers backend on a tiny random model: shapes, logprobs, stopping, seeds, weight reloads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from transformers import (
    DynamicLayer,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sapo.backends import GenerationBackend, Sample, SamplingConfig, TransformersBackend
from sapo.backends.hf import DRAW_BLOCK, ReservedLayer, _RowSampler, draw_index
from sapo.models import build_tiny_model, load_model
from sapo.models.tiny import TinySpec, tiny_config

pytestmark = pytest.mark.unit


def teacher_forced(
    model: torch.nn.Module, prompt: list[int], sample: Sample, temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of the sample's tokens from one forward pass over the unpadded sequence."""
    ids = torch.tensor([prompt + list(sample.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(sample.token_ids)[:, None]).squeeze(1)


def test_backend_satisfies_the_protocol(backend: TransformersBackend) -> None:
    assert isinstance(backend, GenerationBackend)
    assert backend.model_version == 0


def test_returns_b_by_l_samples_with_one_logprob_per_token(
    backend: TransformersBackend, prompts: list[list[int]]
) -> None:
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=8, num_samples=4, seed=0))
    assert [len(g) for g in groups] == [4, 4, 4]
    for sample in (s for g in groups for s in g):
        assert 1 <= len(sample.token_ids) <= 8
        assert len(sample.logprobs) == len(sample.token_ids)
        assert all(lp <= 0 for lp in sample.logprobs)
        assert sample.finish_reason in ("stop", "length")
        assert sample.finish_reason == "stop" or len(sample.token_ids) == 8
    assert backend.generate([], SamplingConfig(max_new_tokens=4)) == []


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_teacher_forced_pass_on_the_unpadded_prompt(
    backend: TransformersBackend, prompts: list[list[int]], temperature: float
) -> None:
    params = SamplingConfig(max_new_tokens=10, num_samples=2, temperature=temperature, seed=1)
    groups = backend.generate(prompts, params)
    recorded = torch.tensor([lp for g in groups for s in g for lp in s.logprobs])
    assert recorded.std() > 0.5  # the tiny model is peaked enough for the comparison to mean something
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            expected = teacher_forced(backend.model, prompt, sample, temperature)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


def test_top_p_does_not_change_the_recorded_distribution(
    backend: TransformersBackend, prompts: list[list[int]]
) -> None:
    """Logprobs stay those of the tempered full distribution even when sampling is truncated."""
    groups = backend.generate(
        prompts, SamplingConfig(max_new_tokens=6, num_samples=2, top_p=0.5, top_k=20, seed=2)
    )
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            expected = teacher_forced(backend.model, prompt, sample, 1.0)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_seeded_draw_picks_what_an_inverse_cdf_over_the_tempered_softmax_picks(temperature: float) -> None:
    """The seeded draw without cut-offs (one buffer: exp((logits - max) / T), cumulated in place)
    chooses, for the same per-row seeds, the token a plain inverse-CDF sampler over
    softmax(logits / T) chooses, records log_softmax(logits / T) of it, and leaves the logits alone."""
    rows, vocab = 64, 3000
    scores = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 4
    original = scores.clone()
    seeds = [1000 + row for row in range(rows)]
    sampler = _RowSampler(seeds, SamplingConfig(max_new_tokens=1, temperature=temperature))
    one_hot = sampler(torch.zeros((rows, 1), dtype=torch.long), scores)  # type: ignore[arg-type]
    chosen = one_hot.argmax(dim=-1)

    cdf = torch.softmax(original / temperature, dim=-1).cumsum(dim=-1)
    draws = torch.cat([torch.rand(1, generator=torch.Generator().manual_seed(s)) for s in seeds])
    expected = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None]).squeeze(1).clamp_max(vocab - 1)
    assert torch.equal(chosen, expected)
    assert torch.equal(scores, original)
    assert bool((one_hot == 0).sum(dim=-1).eq(1).all()) and bool(
        torch.isinf(one_hot).sum(dim=-1).eq(vocab - 1).all()
    )
    reference = torch.log_softmax(original / temperature, dim=-1).gather(1, chosen[:, None]).squeeze(1)
    torch.testing.assert_close(sampler.logprob_of(chosen), reference, atol=1e-5, rtol=0)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=3 * DRAW_BLOCK + 5), st.floats(0, 1)),
        min_size=1,
        max_size=4,
    ),
    vocab=st.sampled_from([1, 7, DRAW_BLOCK, 2 * DRAW_BLOCK + 1, 3 * DRAW_BLOCK]),
)
def test_two_level_draw_finds_what_a_search_over_the_whole_cumulative_sum_finds(
    rows: list[tuple[list[int], float]], vocab: int
) -> None:
    """Integer weights (zeros included) in float64 make every sum exact, so the block sums and the
    one block's cumulative sum must pick exactly the token a search over the whole row's cumulative
    sum picks, draws on a boundary included (a draw of 1.0 stands for the top of the range)."""
    weights = torch.tensor([(w * (vocab // len(w) + 1))[:vocab] for w, _ in rows], dtype=torch.float64)
    weights[:, -1] += 1  # every row has weight somewhere
    cdf = weights.cumsum(dim=1)
    totals = cdf[:, -1]
    # Draws on a cumulative boundary (k / total) as well as anywhere in the range.
    draws = torch.tensor(
        [float(cdf[i, int(u * (vocab - 1))] / totals[i]) if u < 0.5 else u for i, (_, u) in enumerate(rows)],
        dtype=torch.float64,
    )
    chosen, got_totals = draw_index(weights, draws)
    expected = torch.searchsorted(cdf, (draws * totals)[:, None]).clamp_max(vocab - 1)
    assert torch.equal(chosen, expected)
    assert torch.equal(got_totals, totals)


def test_two_level_draw_never_picks_a_zero_weight_token() -> None:
    weights = torch.zeros(3, 5 * DRAW_BLOCK + 17)
    weights[0, 3] = 1.0  # one token in the first block
    weights[1, 5 * DRAW_BLOCK + 16] = 2.0  # the last token, in the partial block
    weights[2, DRAW_BLOCK - 1] = weights[2, DRAW_BLOCK] = 0.5  # either side of a block boundary
    for u in (1e-9, 0.25, 0.5, 0.75, 1 - 1e-7):
        chosen, _ = draw_index(weights, torch.full((3,), u))
        assert chosen[0].item() == 3 and chosen[1].item() == 5 * DRAW_BLOCK + 16
        assert chosen[2].item() == (DRAW_BLOCK - 1 if u <= 0.5 else DRAW_BLOCK)


def test_two_level_draw_refuses_weights_that_diverged() -> None:
    weights = torch.ones(2, 2 * DRAW_BLOCK)
    weights[1, 10] = float("nan")
    with pytest.raises(RuntimeError, match="inf, nan"):
        draw_index(weights, torch.full((2,), 0.5))


def test_stop_string_ends_each_sequence_at_the_token_that_completes_it(
    backend: TransformersBackend, prompts: list[list[int]], tokenizer: PreTrainedTokenizerBase
) -> None:
    # "e" occurs in many tokens of the random model's output, so rows stop at different steps.
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=12, num_samples=4, seed=3, stop=("e",)))
    samples = [s for g in groups for s in g]
    stopped = [s for s in samples if s.finish_reason == "stop"]
    assert stopped and len({len(s.token_ids) for s in stopped}) > 1
    for sample in stopped:
        assert "e" in sample.text
        assert "e" not in tokenizer.decode(list(sample.token_ids[:-1]), skip_special_tokens=True)
    for sample in samples:
        if sample.finish_reason == "length":
            assert "e" not in sample.text and len(sample.token_ids) == 12


def test_eos_token_is_kept_as_the_last_token(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]]
) -> None:
    # A third of the vocabulary counts as end-of-sequence, so most rows stop within a few tokens.
    eos = set(range(0, len(tokenizer), 3))
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer, eos_token_ids=sorted(eos))
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=12, num_samples=4, seed=4))
    samples = [s for g in groups for s in g]
    assert sum(s.finish_reason == "stop" for s in samples) > len(samples) // 2
    for sample in samples:
        assert not eos & set(sample.token_ids[:-1])  # nothing after the first EOS survives
        assert (sample.token_ids[-1] in eos) == (sample.finish_reason == "stop")


def test_same_seed_same_samples_and_global_rng_untouched(
    backend: TransformersBackend, prompts: list[list[int]]
) -> None:
    params = SamplingConfig(max_new_tokens=8, num_samples=3, seed=11)
    rng_before = torch.get_rng_state()
    first = backend.generate(prompts, params)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert backend.generate(prompts, params) == first
    other = backend.generate(prompts, SamplingConfig(max_new_tokens=8, num_samples=3, seed=12))
    assert other != first


def test_reloaded_weights_change_samples_and_version(
    backend: TransformersBackend, prompts: list[list[int]], tokenizer: PreTrainedTokenizerBase
) -> None:
    params = SamplingConfig(max_new_tokens=8, num_samples=2, seed=5)
    original = backend.generate(prompts, params)
    initial_state = {k: v.clone() for k, v in backend.model.state_dict().items()}

    backend.load_weights(build_tiny_model(tokenizer, seed=1).state_dict(), version=7)
    assert backend.model_version == 7
    assert backend.generate(prompts, params) != original

    backend.load_weights(initial_state, version=8)
    assert backend.generate(prompts, params) == original


def test_owned_weights_are_adopted_without_a_copy_and_keep_the_tie(
    backend: TransformersBackend, prompts: list[list[int]], tokenizer: PreTrainedTokenizerBase
) -> None:
    params = SamplingConfig(max_new_tokens=8, num_samples=2, seed=5)
    state = {k: v.clone() for k, v in build_tiny_model(tokenizer, seed=1).state_dict().items()}
    del state["lm_head.weight"]  # stored once, as checkpoints do
    copied = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer)
    copied.load_weights(state, version=3)
    backend.load_weights(state, version=3, owned=True)

    embed = backend.model.model.embed_tokens.weight
    assert embed.data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # adopted
    assert backend.model.lm_head.weight.data_ptr() == embed.data_ptr()  # still tied
    assert copied.model.model.embed_tokens.weight.data_ptr() != state["model.embed_tokens.weight"].data_ptr()
    assert backend.generate(prompts, params) == copied.generate(prompts, params)


def test_reload_from_safetensors_directory_without_the_tied_head(
    backend: TransformersBackend, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """Checkpoints written by save_pretrained omit lm_head.weight when it is tied to the embeddings."""
    state = build_tiny_model(tokenizer, seed=2).state_dict()
    save_file(
        {k: v.clone() for k, v in state.items() if k != "lm_head.weight"}, str(tmp_path / "model.safetensors")
    )
    backend.load_weights(tmp_path, version=1)
    torch.testing.assert_close(backend.model.lm_head.weight, state["model.embed_tokens.weight"])


def test_mismatched_weights_are_rejected_before_anything_is_copied(backend: TransformersBackend) -> None:
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    bad = dict(before)
    bad["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    del bad["model.norm.weight"]
    bad["model.layers.0.self_attn.q_proj.weight"] = torch.zeros_like(
        before["model.layers.0.self_attn.q_proj.weight"]
    )
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        backend.load_weights(bad, version=1)
    assert backend.model_version == 0
    for name, tensor in backend.model.state_dict().items():
        assert torch.equal(tensor, before[name])


def test_generation_failure_becomes_error_samples(
    backend: TransformersBackend, prompts: list[list[int]]
) -> None:
    """Diverged (NaN) weights make sampling raise; every sample of the batch reports the error."""
    nan_state = {k: torch.full_like(v, float("nan")) for k, v in backend.model.state_dict().items()}
    backend.load_weights(nan_state, version=1)
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=4, num_samples=2, seed=0))
    assert [len(g) for g in groups] == [2, 2, 2]
    for sample in (s for g in groups for s in g):
        assert sample.finish_reason == "error"
        assert "probability tensor" in sample.error
        assert sample.token_ids == () and sample.logprobs == ()


def test_bf16_weights_sample_with_consistent_lengths(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]]
) -> None:
    model, _ = load_model("tiny:0", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    groups = TransformersBackend(model, tokenizer).generate(
        prompts, SamplingConfig(max_new_tokens=6, num_samples=2)
    )
    for sample in (s for g in groups for s in g):
        assert len(sample.logprobs) == len(sample.token_ids) > 0
        assert all(torch.isfinite(torch.tensor(sample.logprobs)))


def test_checkpoint_sampling_defaults_are_discarded(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]]
) -> None:
    """A checkpoint's repetition penalty or top-k must not alter the distribution behind the logprobs."""
    model = build_tiny_model(tokenizer, seed=0)
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.top_k = 5
    backend = TransformersBackend(model, tokenizer)
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=8, num_samples=2, seed=6))
    ranks = []
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            ids = torch.tensor([prompt + list(sample.token_ids)])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1]
            chosen = logits.gather(1, torch.tensor(sample.token_ids)[:, None])
            ranks += (logits > chosen).sum(dim=1).tolist()
            expected = teacher_forced(model, prompt, sample, 1.0)
            torch.testing.assert_close(torch.tensor(sample.logprobs), expected, atol=1e-4, rtol=0)
    assert max(ranks) >= 5  # top-k 5 would never sample a token ranked 6th or lower


def test_empty_prompt_is_a_caller_error(backend: TransformersBackend) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[1, 2], []], SamplingConfig(max_new_tokens=2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 4, "num_samples": 0}, "num_samples"),
        ({"max_new_tokens": 4, "temperature": 0.0}, "temperature"),
        ({"max_new_tokens": 4, "top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 4, "top_k": -1}, "top_k"),
        ({"max_new_tokens": 4, "stop": ("",)}, "stop"),
    ],
)
def test_sampling_config_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)  # type: ignore[arg-type]


def test_sample_invariants() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        Sample(text="a", token_ids=(1, 2), logprobs=(-1.0,), finish_reason="stop")
    with pytest.raises(ValueError, match="error"):
        Sample(text="a", token_ids=(1,), logprobs=(-1.0,), finish_reason="error")
    assert Sample.failed("boom").finish_reason == "error"


def test_int8_rollouts_sample_from_a_quantized_copy_that_follows_weight_reloads(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]]
) -> None:
    params = SamplingConfig(max_new_tokens=8, num_samples=2, seed=3, quantization="int8-dynamic")
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer, quantization="int8-dynamic")
    assert backend.quantization == "int8-dynamic"
    assert any(isinstance(m, torch.nn.Linear) for m in backend.model.modules())  # the policy stays fp32
    groups = backend.generate(prompts, params)
    samples = [s for g in groups for s in g]
    assert all(len(s.logprobs) == len(s.token_ids) and all(lp <= 0 for lp in s.logprobs) for s in samples)
    # The recorded log-probs are the copy's: close to the fp32 policy's (per token, on average), not equal.
    gaps = torch.cat(
        [
            (torch.tensor(s.logprobs) - teacher_forced(backend.model, p, s, 1.0)).abs()
            for p, g in zip(prompts, groups, strict=True)
            for s in g
        ]
    )
    assert 0 < gaps.mean().item() < 0.3, gaps
    # New weights reach the copy: sampling equals a fresh int8 backend built on those weights.
    other = build_tiny_model(tokenizer, seed=1)
    backend.load_weights({k: v.clone() for k, v in other.state_dict().items()}, version=1)
    fresh = TransformersBackend(other, tokenizer, quantization="int8-dynamic")
    assert backend.generate(prompts, params) == fresh.generate(prompts, params)
    with pytest.raises(ValueError, match="samples with 'int8-dynamic'"):
        backend.generate(prompts, SamplingConfig(max_new_tokens=2))
    with pytest.raises(ValueError, match="quantization must be one of"):
        TransformersBackend(other, tokenizer, quantization="int4")


def windowed_model(tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A tiny Mistral whose cache layers keep a 6-token window: its prompts cannot be read alone."""
    llama = tiny_config(tokenizer, TinySpec()).to_dict()
    known = MistralConfig().to_dict()
    fields = {k: v for k, v in llama.items() if k in known and k != "model_type"}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MistralForCausalLM(MistralConfig(**fields, sliding_window=6))


@pytest.mark.parametrize("architecture", ["llama", "sliding-window"])
def test_prompts_read_once_sample_what_prompts_read_per_row_sample(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], architecture: str
) -> None:
    """The shared prompt cache is an optimisation only: the same tokens, the same logprobs (up to the
    floating-point differences of other batch shapes), for left-padded prompts down to one token, whether
    each prompt is read alone (Llama) or the batch padded (cache layers that keep a window), with room
    reserved in the cache or not.
    (Not so for int8-dynamic rollouts, whose activation scales follow every call's batch anyway.)"""

    def build() -> PreTrainedModel:
        return build_tiny_model(tokenizer, seed=0) if architecture == "llama" else windowed_model(tokenizer)

    params = SamplingConfig(max_new_tokens=10, num_samples=3, seed=5)
    batch = [*prompts, prompts[1][-1:]]
    per_row = TransformersBackend(build(), tokenizer, share_prompt=False).generate(batch, params)
    for reserve in (True, False):
        shared = TransformersBackend(build(), tokenizer, reserve_cache=reserve).generate(batch, params)
        assert [[s.token_ids for s in g] for g in shared] == [[s.token_ids for s in g] for g in per_row]
        assert [[s.finish_reason for s in g] for g in shared] == [
            [s.finish_reason for s in g] for g in per_row
        ]
        for a, b in zip((s for g in shared for s in g), (s for g in per_row for s in g), strict=True):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("architecture", ["llama", "sliding-window"])
def test_own_decode_loop_samples_exactly_what_generate_samples(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], architecture: str
) -> None:
    """`_decode` replaces ``generate`` for seeded batches with a shared prompt cache: bit for bit the
    same tokens, log-probs and finish reasons, with stop strings, a stop token, cut-offs and rows that
    finish at different steps."""

    def build() -> PreTrainedModel:
        return build_tiny_model(tokenizer, seed=0) if architecture == "llama" else windowed_model(tokenizer)

    batch = [*prompts, prompts[1][-1:]]
    eos = list(range(0, len(tokenizer), 7))  # a seventh of the vocabulary ends a row
    for params in (
        SamplingConfig(max_new_tokens=12, num_samples=3, seed=5, stop=("e",)),
        SamplingConfig(max_new_tokens=6, num_samples=2, seed=6, temperature=0.7, top_p=0.8, top_k=40),
    ):
        ours, reference = (
            TransformersBackend(build(), tokenizer, eos_token_ids=eos, own_decode=own).generate(batch, params)
            for own in (True, False)
        )
        assert len({len(s.token_ids) for g in ours for s in g}) > 1  # rows finished at different steps
        assert [[(s.token_ids, s.logprobs, s.finish_reason) for s in g] for g in ours] == [
            [(s.token_ids, s.logprobs, s.finish_reason) for s in g] for g in reference
        ]


def _states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random keys and values: `batch` rows, 2 heads, `length` positions, head size 4."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, 2, length, 4, generator=generator)
    return keys, torch.randn(batch, 2, length, 4, generator=generator)


def test_reserved_layer_stacks_right_aligned_repeated_prompts_as_padding_and_repeat_would() -> None:
    parts: list[DynamicLayer | None] = []
    for length in (3, 5):
        layer = DynamicLayer()  # type: ignore[no-untyped-call]
        layer.update(*_states(1, length, seed=length))
        parts.append(layer)
    parts.append(None)  # a one-token prompt: nothing before its last token
    stacked = ReservedLayer.stacked(parts, width=5, copies=2, room=3)
    expected = {
        name: torch.cat(
            [
                torch.zeros(1, 2, 5, 4)
                if p is None
                else torch.nn.functional.pad(getattr(p, name), (0, 0, 5 - getattr(p, name).shape[2], 0))
                for p in parts
            ]
        ).repeat_interleave(2, dim=0)
        for name in ("keys", "values")
    }
    torch.testing.assert_close(stacked.keys, expected["keys"], rtol=0, atol=0)
    torch.testing.assert_close(stacked.values, expected["values"], rtol=0, atol=0)
    assert stacked.get_seq_length() == 5


@pytest.mark.parametrize("disturb", ["none", "crop", "reorder", "reset"])
def test_reserved_layer_holds_what_a_dynamic_layer_holds_past_its_room_and_after_replacements(
    disturb: str,
) -> None:
    """Updates write in place while there is room; past it, or after an inherited method replaced the
    keys and values, the layer reserves again and still returns exactly what concatenation would."""
    reference = DynamicLayer()  # type: ignore[no-untyped-call]
    keys, values = _states(3, 4, seed=0)
    reference.update(keys, values)
    room = torch.zeros(3, 2, 2, 4)
    reserved = ReservedLayer(torch.cat([keys, room], dim=2), torch.cat([values, room], dim=2), length=4)
    for step in range(7):
        if step == 3:
            for layer in (reference, reserved):
                if disturb == "crop":
                    layer.crop(-2)
                elif disturb == "reorder":
                    layer.reorder_cache(torch.LongTensor([2, 0, 1]))
                elif disturb == "reset":
                    layer.reset()
        new = _states(3, 1 + step % 2, seed=10 + step)
        got = reserved.update(*new)
        want = reference.update(*new)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert reserved.get_seq_length() == reference.get_seq_length()
