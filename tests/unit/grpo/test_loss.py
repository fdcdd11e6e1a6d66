from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from sapo.grpo.config import LossConfig
from sapo.grpo.layout import TrainSample, pack, split_by_token_budget
from sapo.grpo.logprobs import policy_logprobs
from sapo.grpo.loss import combine_metrics, grpo_loss
from tests.unit.grpo.tiny import EOS_ID, PAD_ID, tiny_llama

pytestmark = pytest.mark.unit


def _leaf(rows: list[list[float]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.float32, requires_grad=True)


def _log(rows: list[list[float]]) -> list[list[float]]:
    return [[math.log(p) for p in row] for row in rows]


def _grad(tensor: Tensor) -> Tensor:
    assert tensor.grad is not None
    return tensor.grad


def test_two_token_example_by_hand() -> None:
    # ratios 1.1 and 1.0 (inside [0.8, 1.28]), A = 2, two completion tokens:
    # loss = -(1.1 * 2 + 1.0 * 2) / 2 = -2.1 ; d loss / d logp_t = -ratio_t * A / 2
    logp = _leaf(_log([[0.55, 0.5]]))
    old = torch.tensor(_log([[0.5, 0.5]]))
    loss, metrics = grpo_loss(logp, torch.tensor([2.0]), torch.tensor([[True, True]]), 2, old_logprobs=old)
    torch.autograd.backward(loss)
    assert loss.item() == pytest.approx(-2.1, rel=1e-6)
    assert _grad(logp).tolist() == [pytest.approx([-1.1, -1.0], rel=1e-6)]
    assert metrics.completion_tokens == 2
    assert metrics.clip_fraction_low == 0 and metrics.clip_fraction_high == 0


def test_clipping_on_both_sides_zeroes_the_gradient_of_clipped_tokens() -> None:
    # row 0: A = +1, ratios 1.5 (clipped high at 1.28) and 0.5 (not clipped: pessimistic branch)
    # row 1: A = -1, ratios 0.5 (clipped low at 0.8) and 1.5 (not clipped)
    ratios = [[1.5, 0.5], [0.5, 1.5]]
    logp = _leaf(_log(ratios))
    old = torch.zeros(2, 2)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, metrics = grpo_loss(logp, torch.tensor([1.0, -1.0]), mask, 4, old_logprobs=old)
    torch.autograd.backward(loss)
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5) / 4, rel=1e-6)
    assert _grad(logp).tolist() == [pytest.approx([0.0, -0.5 / 4]), pytest.approx([0.0, 1.5 / 4])]
    assert metrics.clip_fraction_high == pytest.approx(0.25)
    assert metrics.clip_fraction_low == pytest.approx(0.25)


def test_truncated_importance_weight_multiplies_only_rows_with_behaviour_logprobs() -> None:
    # row 0: logp_old - logp_behaviour = ln 3 (weight truncated to C = 2) and ln 0.5 (weight 0.5)
    # row 1: no behaviour logprobs (an on-policy external group): weight 1
    logp = _leaf([[-1.0, -2.0], [-0.5, 0.0]])
    behaviour = torch.tensor([[-1.0 - math.log(3.0), -2.0 - math.log(0.5)], [9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    loss, metrics = grpo_loss(
        logp,
        torch.tensor([1.0, 1.0]),
        mask,
        3,
        behaviour_logprobs=behaviour,
        has_behaviour=torch.tensor([True, False]),
        config=LossConfig(is_cap=2.0),
    )
    torch.autograd.backward(loss)
    # pi_old = pi_theta (one step), so ratio = 1 and each token's loss is -A * w
    assert loss.item() == pytest.approx(-(2.0 + 0.5 + 1.0) / 3, rel=1e-6)
    assert _grad(logp).tolist() == [pytest.approx([-2 / 3, -0.5 / 3]), pytest.approx([-1 / 3, 0.0])]
    assert behaviour.grad is None  # the weight is a constant
    assert metrics.is_tokens == 2
    assert metrics.is_ratio_max == pytest.approx(3.0)
    assert metrics.is_ratio_min == pytest.approx(0.5)
    assert metrics.is_ratio_mean == pytest.approx(1.75)
    assert metrics.is_truncated_fraction == pytest.approx(0.5)


def test_k3_kl_term_by_hand() -> None:
    # logp_ref - logp = ln 2 -> k3 = 2 - ln 2 - 1. The term is ratio * k3 with ratio = 1 in value, so
    # d/d logp = ratio * k3 + ratio * (1 - exp(ln 2)) = (1 - ln 2) - 1 = -ln 2
    logp = _leaf([[-1.0]])
    ref = torch.tensor([[-1.0 + math.log(2.0)]])
    config = LossConfig(beta=0.1)
    loss, metrics = grpo_loss(
        logp, torch.tensor([0.5]), torch.tensor([[True]]), 1, ref_logprobs=ref, config=config
    )
    torch.autograd.backward(loss)
    assert metrics.kl_mean == pytest.approx(1 - math.log(2.0), rel=1e-6)
    assert loss.item() == pytest.approx(-0.5 + 0.1 * (1 - math.log(2.0)), rel=1e-6)
    assert _grad(logp).item() == pytest.approx(-0.5 - 0.1 * math.log(2.0), rel=1e-6)


def test_prompt_and_padding_values_change_nothing() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[False, False, True, True, True], [False, True, True, False, False]])
    base = {name: -torch.rand(2, 5) for name in ("logp", "old", "behaviour", "ref")}

    def run(values: dict[str, Tensor]) -> tuple[float, Tensor]:
        logp = values["logp"].clone().requires_grad_(True)
        loss, _ = grpo_loss(
            logp,
            torch.tensor([1.0, -0.5]),
            mask,
            int(mask.sum()),
            old_logprobs=values["old"],
            behaviour_logprobs=values["behaviour"],
            ref_logprobs=values["ref"],
            config=LossConfig(beta=0.05),
        )
        torch.autograd.backward(loss)
        return loss.item(), _grad(logp)

    garbage = {
        name: torch.where(mask, t, torch.full_like(t, fill))
        for (name, t), fill in zip(base.items(), [1e4, -1e4, math.nan, 1e4], strict=True)
    }
    loss_clean, grad_clean = run(base)
    loss_dirty, grad_dirty = run(garbage)
    assert loss_dirty == pytest.approx(loss_clean, rel=1e-6)
    assert torch.isfinite(grad_dirty).all()
    assert torch.allclose(grad_dirty, grad_clean)
    assert grad_dirty[~mask].abs().sum().item() == 0


def _samples() -> list[TrainSample]:
    lengths = [(3, 5), (1, 2), (4, 7), (2, 1), (2, 4)]
    return [
        TrainSample(
            prompt_ids=list(range(1, p + 1)),
            completion_ids=[*range(10, 10 + c - 1), EOS_ID],
            advantage=(-1.0) ** i * (i + 1) / 3,
            behaviour_logprobs=[-3.0 + 0.3 * t for t in range(c)] if i % 2 == 0 else None,
        )
        for i, (p, c) in enumerate(lengths)
    ]


def _grads(model: torch.nn.Module) -> list[Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return grads


def test_micro_batches_accumulate_exactly_the_whole_batch_gradient() -> None:
    model = tiny_llama()
    batch = pack(_samples(), pad_token_id=PAD_ID)
    total = batch.completion_tokens

    def step(own_count: bool) -> list[Tensor]:
        for part in split_by_token_budget(batch, max_tokens=16):
            scored = policy_logprobs(model, part)
            loss, _ = grpo_loss(
                scored.logprobs,
                part.advantages,
                part.completion_mask,
                part.completion_tokens if own_count else total,
                behaviour_logprobs=part.behaviour_logprobs,
                has_behaviour=part.has_behaviour,
            )
            torch.autograd.backward(loss)
        return _grads(model)

    scored = policy_logprobs(model, batch)
    whole_loss, whole_metrics = grpo_loss(
        scored.logprobs,
        batch.advantages,
        batch.completion_mask,
        total,
        behaviour_logprobs=batch.behaviour_logprobs,
        has_behaviour=batch.has_behaviour,
        entropy=scored.entropy,
    )
    torch.autograd.backward(whole_loss)
    whole = _grads(model)

    assert len(split_by_token_budget(batch, max_tokens=16)) > 1
    accumulated = step(own_count=False)
    assert all(torch.allclose(a, w, atol=1e-6) for a, w in zip(accumulated, whole, strict=True))
    # Sanity: normalizing each micro-batch by its own count (a per-micro-batch mean) is not the same.
    per_part_mean = step(own_count=True)
    assert not all(torch.allclose(a, w, atol=1e-6) for a, w in zip(per_part_mean, whole, strict=True))

    parts = []
    for part in split_by_token_budget(batch, max_tokens=16):
        part_scored = policy_logprobs(model, part)
        parts.append(
            grpo_loss(
                part_scored.logprobs,
                part.advantages,
                part.completion_mask,
                total,
                behaviour_logprobs=part.behaviour_logprobs,
                has_behaviour=part.has_behaviour,
                entropy=part_scored.entropy,
            )[1]
        )
    combined = combine_metrics(parts)
    assert combined.loss == pytest.approx(whole_metrics.loss, abs=1e-6)
    assert combined.completion_tokens == whole_metrics.completion_tokens
    for name in ("is_ratio_mean", "is_ratio_max", "is_ratio_min", "is_truncated_fraction", "entropy_mean"):
        assert getattr(combined, name) == pytest.approx(getattr(whole_metrics, name), rel=1e-5), name
    assert math.isnan(combined.kl_mean) and math.isnan(whole_metrics.kl_mean)


def test_invalid_arguments_are_rejected() -> None:
    logp, adv, mask = torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="total_completion_tokens"):
        grpo_loss(logp, adv, mask, 0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, adv, mask, 1, config=LossConfig(beta=0.1))
    with pytest.raises(ValueError, match="is_cap"):
        LossConfig(is_cap=0.5)
    with pytest.raises(ValueError, match="eps_low"):
        LossConfig(eps_low=1.0)
    with pytest.raises(ValueError, match="at least one"):
        combine_metrics([])
