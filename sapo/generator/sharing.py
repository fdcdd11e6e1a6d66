"""Sharing policies: which of a node's rollout groups go to the swarm topic (the subset S^n of the paper).

Every group goes to the node's private rollout topic; a sharing policy only decides what the swarm sees.
A group with no scored completion (every generation failed) is never shared whatever the policy: no
node can train on it, so it would only cost the swarm bandwidth.

`fraction` is decided per group by a stable hash of (seed, round, question provenance) rather than a
random draw, so a restarted generator that regenerates a round shares the same questions again, and
any process can recompute the decision.
"""

from __future__ import annotations

from enum import StrEnum

from sapo.tasks.seeds import stable_hash
from sapo.v1 import rollout_pb2

_HASH_SPACE = 2**64


class SharingPolicy(StrEnum):
    ALL = "all"  # every group (the paper's setting)
    NONE = "none"  # nothing: an isolated node that may still consume the swarm
    FRACTION = "fraction"  # a deterministic pseudo-random fraction of the groups
    VARIANCE = "variance"  # only groups whose rewards differ: the ones that carry a GRPO signal


def scored_rewards(group: rollout_pb2.RolloutGroup) -> list[float]:
    """Rewards of the completions that were scored (failed generations carry none)."""
    return [c.reward for c in group.completions if c.HasField("reward")]


def fraction_key(group: rollout_pb2.RolloutGroup, seed: int) -> float:
    """A value in [0, 1) that is a pure function of the seed, the round and the question's provenance."""
    p = group.question.provenance
    digest = stable_hash("share", seed, group.round, p.dataset, p.seed, p.index)
    return digest / _HASH_SPACE


def should_share(
    group: rollout_pb2.RolloutGroup, policy: SharingPolicy, *, fraction: float = 1.0, seed: int = 0
) -> bool:
    """Whether `group` goes to the swarm topic under `policy` (`fraction` and `seed` for FRACTION)."""
    rewards = scored_rewards(group)
    if not rewards or policy is SharingPolicy.NONE:
        return False
    if policy is SharingPolicy.ALL:
        return True
    if policy is SharingPolicy.FRACTION:
        return fraction_key(group, seed) < fraction
    return max(rewards) > min(rewards)
