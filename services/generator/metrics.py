"""Generator metrics (`sapo_generator_*`), declared once on an injected registry.

Labels are bounded: task names come from the node's profile, load-failure reasons from
`LOAD_FAILURE_REASONS`; both are initialised up front so dashboards see zeros, not gaps.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LOAD_FAILURE_REASONS = (
    "digest_mismatch",
    "missing",
    "unavailable",
    "malformed",
    "incompatible",
    "checkpoint",
)
"""Why a policy version was rejected: a manifest or file digest wrong; a file still absent (or the
store still not answering) when retries gave up; an unreadable manifest or file; weights that do not
fit the model; any other checkpoint error."""
RETRY_REASONS = ("missing", "unavailable")
"""Why a load was retried: a manifest or file not visible yet; the store did not answer."""

_ROUND_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
_LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_REWARD_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class GeneratorMetrics:
    def __init__(self, registry: CollectorRegistry, tasks: Iterable[str]) -> None:
        p = "sapo_generator"
        self.groups = Counter(
            f"{p}_groups_total", "Rollout groups published, by task.", ["task"], registry=registry
        )
        self.groups_shared = Counter(
            f"{p}_groups_shared_total", "Rollout groups also published to the swarm topic.", registry=registry
        )
        self.tokens = Counter(f"{p}_tokens_total", "Completion tokens generated.", registry=registry)
        self.generate_seconds = Histogram(
            f"{p}_generate_seconds",
            "Wall time of one round's batched generation call.",
            buckets=_ROUND_BUCKETS,
            registry=registry,
        )
        self.reward = Histogram(
            f"{p}_reward",
            "Mean local reward of each group's scored completions (0-1), by task.",
            ["task"],
            buckets=_REWARD_BUCKETS,
            registry=registry,
        )
        self.completions_failed = Counter(
            f"{p}_completions_failed_total",
            "Completions whose generation failed (published unscored, never as reward 0).",
            registry=registry,
        )
        self.policy_version = Gauge(
            f"{p}_policy_version", "Policy version of the weights in the backend.", registry=registry
        )
        self.announced_version = Gauge(
            f"{p}_announced_version", "Newest policy version announced for this node.", registry=registry
        )
        self.weight_load_retries = Counter(
            f"{p}_weight_load_retries_total",
            "Loads of a policy version retried after a transient failure, by reason.",
            ["reason"],
            registry=registry,
        )
        self.round = Gauge(f"{p}_round", "Round generated most recently.", registry=registry)
        self.weight_load_seconds = Histogram(
            f"{p}_weight_load_seconds",
            "Time from picking up a PolicyUpdate to the weights being swapped in (verify, read, copy).",
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.weight_load_failures = Counter(
            f"{p}_weight_load_failures_total",
            "Announced policy versions that were rejected, by reason; the old weights stayed.",
            ["reason"],
            registry=registry,
        )
        for task in tasks:
            self.groups.labels(task)
            self.reward.labels(task)
        for reason in LOAD_FAILURE_REASONS:
            self.weight_load_failures.labels(reason)
        for reason in RETRY_REASONS:
            self.weight_load_retries.labels(reason)
