from __future__ import annotations

import math

import pytest
import torch

from sapo.grpo.layout import TrainSample, pack
from sapo.grpo.logprobs import policy_logprobs, score_targets, token_logprobs
from tests.unit.grpo.tiny import EOS_ID, PAD_ID, tiny_llama

pytestmark = pytest.mark.unit


def test_token_t_is_scored_by_the_logits_at_t_minus_one() -> None:
    # Two-token vocabulary; position 0's logits predict token 1, position 1's predict token 2.
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0], [5.0, -5.0]]])
    input_ids = torch.tensor([[0, 1, 0]])
    scored = token_logprobs(logits, input_ids)
    assert scored.logprobs.tolist()[0] == pytest.approx([0.0, math.log(3 / 4), math.log(4 / 5)], rel=1e-5)
    p = 4 / 5
    assert scored.entropy[0, 2].item() == pytest.approx(
        -(p * math.log(p) + (1 - p) * math.log(1 - p)), rel=1e-5
    )


def test_entropy_over_a_vocabulary_read_a_chunk_of_positions_at_a_time_is_each_positions() -> None:
    # A 2^18-token vocabulary: the entropy reads one position of log-probs at a time.
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 1 << 18) * 3
    scored = token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    log_dist = torch.log_softmax(logits[:, :-1], dim=-1)
    expected = -(log_dist.exp() * log_dist).sum(-1)
    assert torch.allclose(scored.entropy[:, 1:], expected, atol=1e-4)
    assert (scored.entropy[:, 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_is_that_of_log_softmax_and_gather(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 300) * 2).to(dtype).requires_grad_()
    targets = torch.randint(0, 300, (3, 5))
    upstream = torch.randn(3, 5)
    torch.autograd.backward((score_targets(logits, targets, 0.7)[0] * upstream).sum())
    ours, logits.grad = logits.grad, None
    reference = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.autograd.backward((reference * upstream).sum())
    assert ours is not None and logits.grad is not None and ours.dtype == dtype
    torch.testing.assert_close(
        ours.float(), logits.grad.float(), atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0
    )


def test_positions_past_a_rows_count_are_zero_and_get_no_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 40, requires_grad=True)
    targets = torch.randint(0, 40, (3, 5))
    whole = score_targets(logits, targets, 0.8)
    logprobs, entropy = score_targets(logits, targets, 0.8, counts=[5, 2, 0])
    for row, count in enumerate([5, 2, 0]):
        torch.testing.assert_close(logprobs[row, :count], whole[0][row, :count])
        torch.testing.assert_close(entropy[row, :count], whole[1][row, :count])
        assert (logprobs[row, count:] == 0).all() and (entropy[row, count:] == 0).all()
    torch.autograd.backward(logprobs.sum())
    assert logits.grad is not None
    assert (logits.grad[1, 2:] == 0).all() and (logits.grad[2] == 0).all()
    assert (logits.grad[0] != 0).any() and (logits.grad[1, :2] != 0).any()


def test_a_second_backward_pass_is_refused_rather_than_wrong() -> None:
    logits = torch.randn(1, 2, 7, requires_grad=True)
    scored = score_targets(logits, torch.tensor([[1, 2]]), 1.0)[0].sum()
    torch.autograd.backward(scored, retain_graph=True)
    with pytest.raises(RuntimeError, match="backpropagated twice"):
        torch.autograd.backward(scored)


def test_without_autograd_the_values_are_the_same() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 4, 50), torch.randint(0, 50, (2, 4))
    with torch.no_grad():
        plain = score_targets(logits, targets, 1.0)
    tracked = score_targets(logits.requires_grad_(), targets, 1.0)
    torch.testing.assert_close(plain[0], tracked[0].detach())
    torch.testing.assert_close(plain[1], tracked[1])


def test_temperature_divides_the_logits() -> None:
    logits = torch.tensor([[[0.0, 2.0], [0.0, 0.0]]])
    scored = token_logprobs(logits, torch.tensor([[0, 1]]), temperature=0.5)
    assert scored.logprobs[0, 1].item() == pytest.approx(-math.log1p(math.exp(-4)), rel=1e-5)


def test_logits_for_only_the_last_positions_give_the_same_values() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 5)
    input_ids = torch.randint(0, 5, (2, 6))
    full = token_logprobs(logits, input_ids).logprobs
    tail = token_logprobs(logits[:, 2:], input_ids).logprobs
    assert torch.allclose(full[:, 3:], tail[:, 3:])
    assert tail[:, :3].abs().sum().item() == 0


def _samples() -> list[TrainSample]:
    return [
        TrainSample(prompt_ids=[3, 4, 5, 6], completion_ids=[7, 8, EOS_ID], advantage=1.0),
        TrainSample(prompt_ids=[9, 1], completion_ids=[10, 11, 12, 13, 14, 15, EOS_ID], advantage=1.0),
        TrainSample(prompt_ids=[1, 2], completion_ids=[16], advantage=1.0),
    ]


def _unpadded(model: torch.nn.Module, sample: TrainSample) -> torch.Tensor:
    """Completion log-probs of one sequence run alone, exactly as a sampler would see it."""
    ids = torch.tensor([[*sample.prompt_ids, *sample.completion_ids]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return token_logprobs(logits, ids).logprobs[0, len(sample.prompt_ids) :]


def test_padded_batch_scores_each_token_as_the_unpadded_sequence_does() -> None:
    model = tiny_llama()
    samples = _samples()
    batch = pack(samples, pad_token_id=PAD_ID)
    with torch.no_grad():
        scored = policy_logprobs(model, batch)
    for row, sample in enumerate(samples):
        expected = _unpadded(model, sample)
        assert torch.allclose(scored.logprobs[row][batch.completion_mask[row]], expected, atol=1e-5)


def test_padding_between_prompt_and_completion_would_shift_the_scores() -> None:
    """Sensitivity check: the layout the public reference used changes the log-probs noticeably."""
    model = tiny_llama()
    sample = _samples()[0]
    pads = 3
    ids = torch.tensor([[*sample.prompt_ids, *[PAD_ID] * pads, *sample.completion_ids]])
    attention = torch.ones_like(ids)
    attention[0, len(sample.prompt_ids) : len(sample.prompt_ids) + pads] = 0
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits
    shifted = token_logprobs(logits, ids).logprobs[0, len(sample.prompt_ids) + pads :]
    assert (shifted - _unpadded(model, sample)).abs().max().item() > 1e-2
