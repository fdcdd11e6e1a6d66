"""Scoring each distinct prompt once gives the log-probs and gradients of scoring every row whole."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from sapo.grpo.layout import PackedBatch, TrainSample, pack
from sapo.grpo.logprobs import TokenLogprobs, policy_logprobs
from sapo.grpo.shared_prompt import shared_prompt_logprobs
from sapo.models import build_tiny_model, load_bundled_tokenizer
from sapo.tasks import EASY_PROFILE, TaskStream, prompt_ids
from tests.unit.grpo.tiny import EOS_ID, PAD_ID, WORDS, tiny_llama

pytestmark = pytest.mark.unit

Scorer = Callable[[nn.Module, PackedBatch, float], TokenLogprobs]


def _ids(count: int, seed: int) -> list[int]:
    return torch.randint(0, WORDS, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _mixed() -> list[TrainSample]:
    """Three prompts of different lengths, completions of 1 to 6 tokens, one prompt's rows not adjacent,
    and a prompt that is another one's prefix (equal ids, not equal starts, make a group)."""
    long, short, other = _ids(9, 1), _ids(4, 2), _ids(6, 3)
    rows = [
        (long, [*_ids(5, 10), EOS_ID]),
        (short, _ids(2, 11)),
        (long, _ids(1, 12)),
        (other, [*_ids(3, 13), EOS_ID]),
        (long[:6], _ids(4, 14)),
        (short, [EOS_ID]),
        (long, _ids(4, 15)),
    ]
    return [TrainSample(p, c, advantage=0.5 - i / 4) for i, (p, c) in enumerate(rows)]


def _scored_with_grads(
    model: nn.Module,
    batch: PackedBatch,
    score: Callable[[nn.Module, PackedBatch, float], TokenLogprobs],
    temperature: float,
) -> tuple[TokenLogprobs, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    scored = score(model, batch, temperature)
    weights = torch.linspace(-1.0, 1.0, batch.seq_len)  # every token's log-prob gets its own weight
    (
        torch.where(batch.completion_mask, scored.logprobs, 0.0) * weights * batch.advantages[:, None]
    ).sum().backward()  # type: ignore[no-untyped-call]
    return scored, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(model: nn.Module, batch: PackedBatch, temperature: float = 1.0) -> None:
    whole, whole_grads = _scored_with_grads(model, batch, policy_logprobs, temperature)
    shared, shared_grads = _scored_with_grads(model, batch, shared_prompt_logprobs, temperature)
    mask = batch.completion_mask
    assert shared.logprobs.shape == whole.logprobs.shape
    torch.testing.assert_close(shared.logprobs[mask], whole.logprobs[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared.entropy[mask], whole.entropy[mask], atol=1e-5, rtol=1e-5)
    assert not shared.logprobs[~mask].any()
    assert shared_grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        # Each gradient is a sum over every position that uses the weight, summed in another order by
        # the two paths (and by each CPU's kernels): the absolute tolerance scales with the tensor.
        # On an AVX-512 host the bundled tokenizer's group differed by 1.05e-5 in one embedding entry
        # of 3.1M (largest entry 12.2); a wrong gradient differs by the size of its entries.
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_gradients_equal_those_of_whole_rows(attention: str, temperature: float) -> None:
    model = tiny_llama(seed=3)
    model.set_attn_implementation(attention)
    _assert_same(model, pack(_mixed(), pad_token_id=PAD_ID), temperature)


def test_one_token_completions_are_scored_from_the_prompt_pass_alone() -> None:
    samples = [TrainSample(_ids(5, 1), [t], 1.0) for t in (3, 7, EOS_ID)] + [
        TrainSample(_ids(3, 2), [4], -1.0)
    ]
    _assert_same(tiny_llama(seed=4), pack(samples, pad_token_id=PAD_ID))


def test_a_group_of_the_bundled_tiny_model_scores_the_same() -> None:
    """`tiny:0` as the trainer sees it: tied embeddings, a 49k vocabulary, the chat template's ids."""
    tokenizer = load_bundled_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    model.eval()  # type: ignore[no-untyped-call]
    question = next(iter(TaskStream(EASY_PROFILE, 1, "train")))
    completions = ["5</answer>", "6", "I think it is 5", "5 or 6</answer>"]
    samples = [
        TrainSample(prompt_ids(tokenizer, question), tokenizer.encode(c, add_special_tokens=False), i % 2)
        for i, c in enumerate(completions)
    ]
    _assert_same(model, pack(samples, pad_token_id=int(tokenizer.eos_token_id)))
