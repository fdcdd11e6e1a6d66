"""Token-level PPO-clip GRPO loss with a truncated importance-sampling correction for stale samples.

Three policies appear, each as per-token log-probs of the same completion tokens:

- pi_theta (`logprobs`): the policy being trained, with gradient.
- pi_old (`old_logprobs`): the "proximal" policy the PPO ratio is clipped around, i.e. the weights
  at the start of this batch's optimizer steps, scored by the trainer itself. With one optimizer
  step per batch it is pi_theta detached (the default), so the ratio starts at exactly 1; it moves
  away from 1, and clipping engages, only from the second optimizer step on the same batch.
- pi_behaviour (`behaviour_logprobs`): the policy the generator actually sampled from, reported
  with the rollout. It differs from pi_old when training moved on after sampling (staleness > 0)
  or when the sampler's numerics differ (vLLM, bf16).

Per completion token, with A the row's advantage:

    ratio     = exp(logp_theta - logp_old)
    per_token = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    per_token *= w,  w = min(exp(logp_old - logp_behaviour), C), detached (rows with behaviour only)
    per_token += beta * ratio * (exp(logp_ref - logp_theta) - (logp_ref - logp_theta) - 1)
    loss      = sum(per_token over completion tokens) / total completion tokens of the whole batch

This mirrors TRL 1.16's GRPOTrainer with `loss_type="dapo"` and
`vllm_importance_sampling_mode="token_truncate"`: there `importance_sampling_ratio =
clamp(exp(old_per_token_logps - sampling_per_token_logps), max=vllm_importance_sampling_clip_max)`
is computed without gradient and multiplies the clipped policy term before the KL term is added;
its default cap is 3.0, ours is 2.0. The KL term is TRL's k3 estimator times the differentiable
ratio (`use_bias_correction_kl=True`, TRL's default): tokens were drawn from pi_old, and the ratio
makes both the value and the gradient those of the reverse KL(pi_theta || pi_ref) (DeepSeek-V3.2);
without it the k3 gradient is biased even on-policy. The product ratio * w equals
pi_theta / pi_behaviour inside the clip range, which is the off-policy correction; clipping stays
centred on pi_old so a stale sample cannot pull the update further than a trust region around the
current weights (decoupled PPO).
For on-policy rows (external groups in the paper's mode, where there is no behaviour log-prob) w = 1.

The normalizer is passed in rather than counted here, so a batch split into micro-batches
accumulates exactly the gradient of the whole batch. Values at masked positions (prompt, padding)
are replaced before any exp, so garbage there can produce neither a loss term nor a NaN gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sapo.grpo.config import DEFAULT_LOSS_CONFIG, LossConfig


@dataclass(frozen=True)
class LossMetrics:
    """What one loss call saw. Fractions and means are over completion tokens; NaN means "no data".

    clip_fraction_low: tokens with ratio < 1 - eps_low and A < 0 (clipped, no gradient).
    clip_fraction_high: tokens with ratio > 1 + eps_high and A > 0 (clipped, no gradient).
    is_ratio_*: raw exp(logp_old - logp_behaviour) before truncation, over tokens of rows with
        behaviour log-probs (`is_tokens` of them); is_truncated_fraction: share of those above C.
    kl_mean: ratio-weighted k3 estimate of KL(pi_theta || pi_ref), when ref_logprobs were given.
    """

    loss: float
    completion_tokens: int
    clip_fraction_low: float
    clip_fraction_high: float
    is_tokens: int
    is_ratio_mean: float
    is_ratio_max: float
    is_ratio_min: float
    is_truncated_fraction: float
    entropy_mean: float
    kl_mean: float


def _mean(values: Tensor, mask: Tensor) -> float:
    count = int(mask.sum().item())
    return float(values[mask].float().sum().item()) / count if count else math.nan


def grpo_loss(
    logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    total_completion_tokens: int,
    *,
    old_logprobs: Tensor | None = None,
    behaviour_logprobs: Tensor | None = None,
    has_behaviour: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    config: LossConfig = DEFAULT_LOSS_CONFIG,
) -> tuple[Tensor, LossMetrics]:
    """The GRPO loss of one (micro-)batch; see the module docstring for the formula.

    Token tensors are (B, L) and aligned with each other (e.g. with `PackedBatch.input_ids`);
    `advantages` and `has_behaviour` are (B,). `old_logprobs=None` means pi_old = pi_theta (one
    optimizer step per batch). `behaviour_logprobs=None` disables the importance correction;
    `has_behaviour` selects the rows that have behaviour log-probs (default: all rows).
    `ref_logprobs` is required when beta > 0 and otherwise only feeds the `kl_mean` metric;
    `entropy` only feeds `entropy_mean`. `total_completion_tokens` is the completion-token count of
    the whole optimizer batch, so the losses of its micro-batches sum to the batch loss.
    """
    if total_completion_tokens <= 0:
        raise ValueError(f"total_completion_tokens must be positive; got {total_completion_tokens}")
    if config.beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference policy's token log-probs)")
    mask = completion_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logp = torch.where(mask, logprobs, zero)
    old = logp.detach() if old_logprobs is None else torch.where(mask, old_logprobs.detach(), zero)
    adv = advantages.to(logp.dtype).unsqueeze(1)

    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1 - config.eps_low, 1 + config.eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)

    is_mask = torch.zeros_like(mask)
    raw_is = torch.ones_like(old)
    if behaviour_logprobs is not None:
        rows = torch.ones_like(mask[:, 0]) if has_behaviour is None else has_behaviour.bool()
        is_mask = mask & rows.unsqueeze(1)
        log_is = torch.where(is_mask, old - behaviour_logprobs.detach().to(old.dtype), zero)
        raw_is = torch.exp(log_is)
        per_token = per_token * torch.clamp(raw_is, max=config.is_cap)

    kl: Tensor | None = None
    if ref_logprobs is not None:
        ref_minus = torch.where(mask, ref_logprobs.detach().to(logp.dtype), zero) - logp
        kl = ratio * (torch.exp(ref_minus) - ref_minus - 1)
        if config.beta > 0:
            per_token = per_token + config.beta * kl

    loss = torch.where(mask, per_token, zero).sum() / total_completion_tokens
    with torch.no_grad():
        is_values = raw_is[is_mask]
        metrics = LossMetrics(
            loss=float(loss.item()),
            completion_tokens=int(mask.sum().item()),
            clip_fraction_low=_mean((ratio < 1 - config.eps_low) & (adv < 0), mask),
            clip_fraction_high=_mean((ratio > 1 + config.eps_high) & (adv > 0), mask),
            is_tokens=int(is_values.numel()),
            is_ratio_mean=float(is_values.mean().item()) if is_values.numel() else math.nan,
            is_ratio_max=float(is_values.max().item()) if is_values.numel() else math.nan,
            is_ratio_min=float(is_values.min().item()) if is_values.numel() else math.nan,
            is_truncated_fraction=_mean(raw_is > config.is_cap, is_mask),
            entropy_mean=math.nan if entropy is None else _mean(entropy, mask),
            kl_mean=math.nan if kl is None else _mean(kl, mask),
        )
    return loss, metrics


def _weighted(values: Sequence[float], weights: Sequence[int]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if w > 0 and not math.isnan(v)]
    total = sum(w for _, w in pairs)
    return math.fsum(v * w for v, w in pairs) / total if total else math.nan


def _present(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def combine_metrics(parts: Sequence[LossMetrics]) -> LossMetrics:
    """Metrics of a whole optimizer batch from those of its micro-batches.

    Losses add up (each was already normalized by the batch's total token count); means are
    token-weighted, so the result equals what one call on the whole batch would report.
    """
    if not parts:
        raise ValueError("combine_metrics needs at least one micro-batch's metrics")
    tokens = [p.completion_tokens for p in parts]
    is_tokens = [p.is_tokens for p in parts]
    return LossMetrics(
        loss=math.fsum(p.loss for p in parts),
        completion_tokens=sum(tokens),
        clip_fraction_low=_weighted([p.clip_fraction_low for p in parts], tokens),
        clip_fraction_high=_weighted([p.clip_fraction_high for p in parts], tokens),
        is_tokens=sum(is_tokens),
        is_ratio_mean=_weighted([p.is_ratio_mean for p in parts], is_tokens),
        is_ratio_max=max(_present([p.is_ratio_max for p in parts]), default=math.nan),
        is_ratio_min=min(_present([p.is_ratio_min for p in parts]), default=math.nan),
        is_truncated_fraction=_weighted([p.is_truncated_fraction for p in parts], is_tokens),
        entropy_mean=_weighted([p.entropy_mean for p in parts], tokens),
        kl_mean=_weighted([p.kl_mean for p in parts], tokens),
    )
