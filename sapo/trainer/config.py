"""The optimizer's and the step's configuration, plain data without torch: `TrainerSettings` builds
them (and declares and bounds every value) before any model library loads; `optim` and `step` use them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sapo.grpo.config import LossConfig

Schedule = Literal["constant", "cosine"]


@dataclass(frozen=True)
class OptimConfig:
    """lr: peak learning rate. betas / eps / weight_decay: AdamW's. warmup_steps: optimizer steps of
    linear warmup. schedule: what follows warmup; cosine decays to lr * min_lr_ratio at total_steps and
    stays there. Built by `TrainerSettings.optim_config`, which declares and bounds every value."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_steps: int
    schedule: Schedule
    total_steps: int
    min_lr_ratio: float


Precision = Literal["fp32", "bf16"]


@dataclass(frozen=True)
class StepConfig:
    """micro_batch_tokens: padded tokens per forward pass (see `plan_micro_batches`); bounds activation
    memory. steps_per_batch: optimizer steps on the same batch. precision: "bf16" runs forward and
    backward under bf16 autocast, parameters and optimizer state stay fp32. Built by
    `TrainerSettings.step_config`, which declares and bounds every value."""

    loss: LossConfig
    micro_batch_tokens: int
    steps_per_batch: int
    max_grad_norm: float
    precision: Precision
