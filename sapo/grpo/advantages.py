"""Group-relative advantages: how much better each completion did than its siblings.

GRPO replaces a learned value baseline with the group mean: every completion of one question is
scored, and its advantage is (r - mean) / (std + eps). A group whose rewards are all equal (all right
or all wrong) says nothing about which completion to prefer, so it carries no signal; the sampler
drops such groups and this module returns exact zeros for them.

Std convention: TRL 1.16's GRPOTrainer (`scale_rewards="group"`) divides by
`trl.trainer.utils.nanstd`, which applies Bessel's correction, i.e. the *sample* standard deviation
(divide by n - 1), and adds eps = 1e-4. We match that so our advantages equal TRL's on the same
rewards. For n = 1 the sample std is undefined; a single completion has no sibling to compare with,
so its advantage is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

AdvantageScale = Literal["std", "none"]

# Spread below which a group counts as constant: verifier rewards are exact small rationals, so
# anything smaller is floating-point noise rather than a real preference between completions.
SIGNAL_TOLERANCE = 1e-9


def _checked(rewards: Sequence[float]) -> list[float]:
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError("a rollout group needs at least one reward; got an empty group")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite numbers; got {values}")
    return values


def has_signal(rewards: Sequence[float]) -> bool:
    """True when the group's rewards differ, i.e. GRPO can tell better from worse completions."""
    values = _checked(rewards)
    return max(values) - min(values) > SIGNAL_TOLERANCE


def group_advantages(
    rewards: Sequence[float], scale: AdvantageScale = "std", eps: float = 1e-4
) -> list[float]:
    """Advantages of one group: (r - mean) / (std + eps), or r - mean with `scale="none"`.

    `scale="none"` is the Dr. GRPO variant: dividing by the group std up-weights nearly-solved and
    nearly-failed questions; leaving it out keeps every question's weight proportional to its spread.
    The std is the sample std (n - 1), as in TRL 1.16 (see the module docstring).
    """
    values = _checked(rewards)
    if eps < 0:
        raise ValueError(f"eps must be >= 0; got {eps}")
    if not has_signal(values):
        return [0.0] * len(values)
    n = len(values)
    mean = math.fsum(values) / n
    centred = [v - mean for v in values]
    if scale == "none":
        return centred
    if scale != "std":
        raise ValueError(f"scale must be 'std' or 'none'; got {scale!r}")
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]
