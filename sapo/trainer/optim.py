"""AdamW and its learning-rate schedule: linear warmup, then constant or cosine decay.

The paper states lr 1e-3 while its reference code uses 1e-6 to 1e-5, so the rate
is always an explicit setting, logged at start and exported as a gauge on every step. The schedule
counts optimizer steps (several per batch with `steps_per_batch` > 1), not batches.

The first warmup step already trains at lr / warmup_steps rather than at 0: a zero-rate step would
consume a batch (and a policy version) without learning anything from it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from sapo.trainer.config import OptimConfig


def lr_factor(step: int, config: OptimConfig) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / (config.total_steps - config.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine


def build_optimizer(
    parameters: Iterable[nn.Parameter], config: OptimConfig
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and the matching schedule (call `scheduler.step()` after
    every `optimizer.step()`)."""
    trainable = [p for p in parameters if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config))
    return optimizer, scheduler


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])
