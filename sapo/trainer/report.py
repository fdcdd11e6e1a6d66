"""The wire summary of one training step (`StepMetrics`), as a `PolicyUpdate` announces it.

Shared by the trainer service (which attaches it to the policy announcement) and the in-process swarm
(which writes it to the run record directly), so both record a step the same way.
"""

from __future__ import annotations

import math

from sapo.trainer.contributions import contributions
from sapo.trainer.engine import StepReport
from sapo.v1 import policy_pb2


def step_metrics(report: StepReport) -> policy_pb2.StepMetrics:
    """The wire summary of a step; NaN ("no data") becomes 0 as the contract asks."""

    def finite(value: float) -> float:
        return value if math.isfinite(value) else 0.0

    built = report.built
    local = sum(1 for row in built.rows if row.local)
    proto = policy_pb2.StepMetrics(
        reward_mean=finite(built.reward_mean()),
        local_reward_mean=finite(built.reward_mean(local_only=True)),
        step_seconds=report.seconds,
        step_cpu_seconds=report.cpu_seconds,
        local_completions=local,
        external_completions=len(built.rows) - local,
        intake=report.intake,
    )
    if report.stats is not None:
        m = report.stats.metrics
        proto.loss = finite(m.loss)
        proto.clip_fraction_low = finite(m.clip_fraction_low)
        proto.clip_fraction_high = finite(m.clip_fraction_high)
        proto.grad_norm = finite(report.stats.grad_norm)
        proto.entropy = finite(m.entropy_mean)
        proto.completion_tokens = report.stats.completion_tokens
        proto.contributions.extend(c.to_proto() for c in contributions(built.rows))
    return proto
