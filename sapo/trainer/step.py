"""One batch's optimizer step(s): micro-batches by token budget, pi_old per row mode, clip and update.

pi_old and clipping. Every row has a mode (`sapo.trainer.sequences.RowMode`):

- BEHAVIOUR rows (local, staleness 0) use the sampler's log-probs as pi_old. The ratio then measures
  the real train/sample mismatch (sampler numerics, bf16, vLLM) and clipping can act from the first step.
- CORRECTED rows (local with staleness > 0, external in "sender" mode) use the current policy as pi_old
  and multiply the clipped term by the truncated importance weight min(pi_old / pi_behaviour, is_cap),
  which corrects for having been sampled by another policy (decoupled PPO, see `sapo.grpo.loss`).
- ON_POLICY rows (re-tokenized text: the paper's external groups) use the current policy as pi_old and
  have no importance weight.

"Current policy" means the weights at the start of the batch. Their log-probs are taken from the first
optimizer step's own forward passes (detached): every micro-batch of that step runs before the first
update, so these are exactly the start-of-batch log-probs, without a separate no-grad pass. With
`steps_per_batch` > 1 the same batch is stepped again and pi_old stays fixed at those first values, so
the ratio moves away from 1 and clipping bounds how far one batch can pull the policy.

The loss of every micro-batch is normalized by the completion tokens of the whole batch
(`grpo_loss(total_completion_tokens=...)`), so accumulating micro-batch gradients gives exactly the
gradient of the whole batch whatever the token budget.

Rows are packed separately per (temperature, mode, prompt length): log-probs need the temperature the
group was sampled with, one mode per micro-batch keeps the loss call simple, and `plan_micro_batches`
says why prompt lengths are not mixed. The completions of one prompt are scored on one computation of
it (`sapo.grpo.shared_prompt`), except under gradient checkpointing. Models stay in eval mode (no
dropout: the ratios compare deterministic policies); gradient checkpointing, which transformers only
applies to layers in training mode, flips that flag on the checkpointed layers alone.

A step whose gradient norm is not finite is not applied (counted in `StepStats.skipped_updates`): one
NaN update would poison the weights of every later version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sapo.grpo.config import LossConfig
from sapo.grpo.layout import (
    PackedBatch,
    pack,
    prompt_groups,
    split_by_shared_prompt_budget,
    split_by_token_budget,
)
from sapo.grpo.logprobs import TokenLogprobs, policy_logprobs
from sapo.grpo.loss import LossMetrics, combine_metrics, grpo_loss
from sapo.grpo.shared_prompt import shared_prompt_logprobs
from sapo.trainer.config import Precision, StepConfig
from sapo.trainer.sequences import Row, RowMode


@dataclass(frozen=True)
class MicroBatch:
    """shared_prompt: score with `shared_prompt_logprobs` (each distinct prompt computed once) rather
    than `policy_logprobs`; the planner sets it where the micro-batch has rows sharing a prompt."""

    packed: PackedBatch
    temperature: float
    mode: RowMode
    shared_prompt: bool = False


@dataclass(frozen=True)
class StepStats:
    """What the step(s) on one batch did. `metrics` averages the optimizer steps (max / min of IS
    ratios over all); `grad_norm` is the mean pre-clip norm; `skipped_updates` counts steps whose
    gradient was not finite and was therefore not applied."""

    metrics: LossMetrics
    grad_norm: float
    optimizer_steps: int
    skipped_updates: int
    completion_tokens: int


def plan_micro_batches(
    rows: Sequence[Row], pad_token_id: int, max_tokens: int, *, share_prompts: bool
) -> list[MicroBatch]:
    """Rows packed per (temperature, mode, prompt length), each pack split by the token budget.

    Rows of different prompt lengths never share a micro-batch: `policy_logprobs` computes the
    vocabulary-sized logits of every row from the micro-batch's earliest completion position on, so a
    90-token prompt beside a 350-token one would cost 260 wasted logit positions per row (with shared
    prompts it would cost prompt-pass padding instead).

    With `share_prompts` (off under gradient checkpointing, which cannot run with a key/value cache)
    the completions of one prompt stay in one micro-batch where the budget allows, the prompt counts
    once against it (`split_by_shared_prompt_budget`), and micro-batches where some rows share a prompt
    are scored with `shared_prompt_logprobs`; without it every row counts its whole length.
    """
    parts: dict[tuple[float, RowMode, int], list[Row]] = {}
    for row in rows:
        key = (row.temperature, row.mode, len(row.sample.prompt_ids))
        parts.setdefault(key, []).append(row)
    planned: list[MicroBatch] = []
    for (temperature, mode, _), part in parts.items():
        packed = pack([r.sample for r in part], pad_token_id)
        if not share_prompts:
            planned += [MicroBatch(mb, temperature, mode) for mb in split_by_token_budget(packed, max_tokens)]
            continue
        for mb in split_by_shared_prompt_budget(packed, max_tokens):
            shared = len(prompt_groups(mb)) < mb.num_rows
            planned.append(MicroBatch(mb, temperature, mode, shared_prompt=shared))
    return planned


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager[None]:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _loss(
    mb: MicroBatch, scored: TokenLogprobs, old: Tensor, *, total: int, config: LossConfig
) -> tuple[Tensor, LossMetrics]:
    batch = mb.packed
    corrected = mb.mode is RowMode.CORRECTED
    return grpo_loss(
        scored.logprobs,
        batch.advantages,
        batch.completion_mask,
        total,
        old_logprobs=old,
        behaviour_logprobs=batch.behaviour_logprobs if corrected else None,
        has_behaviour=batch.has_behaviour if corrected else None,
        entropy=scored.entropy,
        config=config,
    )


def train_on_batch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    micro_batches: Sequence[MicroBatch],
    config: StepConfig,
) -> StepStats:
    """Run `config.steps_per_batch` optimizer steps on the batch; see the module docstring."""
    if not micro_batches:
        raise ValueError("train_on_batch needs at least one micro-batch; empty batches take no step")
    device = next(model.parameters()).device
    placed = [dataclasses.replace(mb, packed=mb.packed.to(device)) for mb in micro_batches]
    total = sum(mb.packed.completion_tokens for mb in placed)
    olds: list[Tensor] = []
    parts: list[LossMetrics] = []
    norms: list[float] = []
    skipped = 0
    for step in range(config.steps_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for i, mb in enumerate(placed):
            with autocast(device, config.precision):
                score = shared_prompt_logprobs if mb.shared_prompt else policy_logprobs
                scored = score(model, mb.packed, mb.temperature)
            if step == 0:
                olds.append(_pi_old(mb, scored.logprobs))
            loss, metrics = _loss(mb, scored, olds[i], total=total, config=config.loss)
            loss.backward()  # type: ignore[no-untyped-call]
            parts.append(metrics)
        norm = _clip(model, config.max_grad_norm)
        norms.append(norm)
        if math.isfinite(norm):
            optimizer.step()
            scheduler.step()
        else:
            skipped += 1
    optimizer.zero_grad(set_to_none=True)
    return StepStats(
        metrics=_average_steps(combine_metrics(parts), config.steps_per_batch),
        grad_norm=math.fsum(norms) / len(norms),
        optimizer_steps=config.steps_per_batch - skipped,
        skipped_updates=skipped,
        completion_tokens=total,
    )


def _pi_old(mb: MicroBatch, logprobs: Tensor) -> Tensor:
    """Start-of-batch pi_old: the sampler's log-probs for BEHAVIOUR rows, else the current policy."""
    if mb.mode is RowMode.BEHAVIOUR:
        return mb.packed.behaviour_logprobs
    return logprobs.detach().clone()


def _clip(model: nn.Module, max_norm: float) -> float:
    """Pre-clip global L2 gradient norm; clips to max_norm unless it is 0 (measure only)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    limit = max_norm if max_norm > 0 else math.inf
    return float(torch.nn.utils.clip_grad_norm_(params, limit).item())


def _average_steps(metrics: LossMetrics, steps: int) -> LossMetrics:
    """combine_metrics over k identical-token steps sums the losses and the token counts k times."""
    return dataclasses.replace(
        metrics,
        loss=metrics.loss / steps,
        completion_tokens=metrics.completion_tokens // steps,
        is_tokens=metrics.is_tokens // steps,
    )


@contextlib.contextmanager
def checkpointed_layers_training(model: nn.Module) -> Iterator[None]:
    """Switch on training mode for exactly the layers transformers checkpoints, for the block.

    transformers applies gradient checkpointing only to layers whose own `training` flag is set. Setting
    that flag on those layers alone (not `model.train()`, which recurses) leaves their attention, MLP
    and dropout submodules in eval mode, so no dropout creeps into the ratios.
    """
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False
