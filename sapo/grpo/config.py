"""The GRPO loss's configuration, plain data without torch: the trainer's settings declare their
defaults and bounds from it before any model library loads (`sapo.grpo.loss` is the loss itself)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossConfig:
    """eps_low / eps_high: PPO clip range [1 - eps_low, 1 + eps_high] (DAPO's asymmetric 0.2 / 0.28).
    beta: weight of the (ratio-corrected) k3 KL to a reference policy (0 in the paper: no reference
    model needed).
    is_cap: upper truncation C of the behaviour importance weight; bounds the variance a very stale
    or mismatched sample can add.
    """

    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0
    is_cap: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"eps_low must be in [0, 1); got {self.eps_low}")
        if self.eps_high < 0:
            raise ValueError(f"eps_high must be >= 0; got {self.eps_high}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0; got {self.beta}")
        if self.is_cap < 1:
            raise ValueError(f"is_cap must be >= 1 (1 disables up-weighting); got {self.is_cap}")


DEFAULT_LOSS_CONFIG = LossConfig()
