"""The sampler's own metrics (`sapo_sampler_*`), declared once on the runtime's registry.

Transport-level counts (messages read, dead-lettered, produced) come from `TransportMetrics` on the
same registry; these say what the filter pipeline and the batch assembly did. Every label is bounded
and initialised up front, so dashboards see zeros rather than missing series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sapo.sampler import ORIGINS, REASONS

SOURCES = ("local", "external")
_COUNT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_VERSION_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)
_AGE_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class SamplerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.consumed = Counter(
            "sapo_sampler_groups_consumed_total",
            "Rollout groups read, by origin (local: own generator; external: the swarm topic).",
            ["origin"],
            registry=registry,
        )
        self.rejected = Counter(
            "sapo_sampler_groups_rejected_total",
            "Groups not used, by reason: filters (header, malformed, verification, freshness, dedupe, "
            "signal) and pool discards (expired, evicted, unused, late_round, future_round).",
            ["reason"],
            registry=registry,
        )
        self.batches = Counter(
            "sapo_sampler_batches_emitted_total",
            "Training batches acknowledged by the broker.",
            registry=registry,
        )
        self.batch_groups = Histogram(
            "sapo_sampler_batch_groups",
            "Groups per emitted batch, by source (the realised I/J mix).",
            ["source"],
            buckets=_COUNT_BUCKETS,
            registry=registry,
        )
        self.staleness = Histogram(
            "sapo_sampler_group_staleness_versions",
            "Policy versions between a local group's sampling policy and the batch that uses it.",
            buckets=_VERSION_BUCKETS,
            registry=registry,
        )
        self.age = Histogram(
            "sapo_sampler_group_age_seconds",
            "Seconds from a group's completion to the batch that uses it, by origin.",
            ["origin"],
            buckets=_AGE_BUCKETS,
            registry=registry,
        )
        self.pool = Gauge(
            "sapo_sampler_pool_groups",
            "Groups waiting in the pool for a batch, by origin.",
            ["origin"],
            registry=registry,
        )
        for origin in ORIGINS:
            self.consumed.labels(origin)
            self.age.labels(origin)
            self.pool.labels(origin)
        for reason in REASONS:
            self.rejected.labels(reason)
        for source in SOURCES:
            self.batch_groups.labels(source)
