"""Trainer metrics, declared once on the service's registry: `sapo_trainer_<noun>_<unit>`.

Gauges hold the latest step's values (a dashboard plots them over time); counters accumulate; durations
are histograms in seconds. Labels are bounded enums, initialised up front so every series exists from
the first scrape.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sapo.trainer import RowMode, StepReport

P = "sapo_trainer"
SKIP_REASONS = ("error", "bad_logprobs", "bad_question", "bad_temperature", "prompt_too_long", "empty")
BATCH_OUTCOMES = ("trained", "empty", "duplicate")
PUBLISH_OUTCOMES = ("written", "verified", "diverged", "skipped")
STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
CHECKPOINT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32)


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"{P}_{name}", doc, labels, registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{P}_{name}", doc, labels, registry=registry)

        self.steps = counter("steps", "Optimizer steps applied (several per batch with steps_per_batch > 1).")
        self.skipped_updates = counter(
            "nonfinite_updates", "Optimizer steps not applied because the gradient norm was not finite."
        )
        self.batches = counter("batches", "Training batches consumed, by outcome.", ("outcome",))
        self.sequence_gaps = counter(
            "sequence_gaps", "Batch sequence numbers skipped upstream (a batch arrived ahead of the next)."
        )
        self.sequences = counter("sequences", "Completions trained on, by pi_old mode.", ("mode",))
        self.sequences_truncated = counter(
            "sequences_truncated", "Completions cut to max_sequence_tokens before training."
        )
        self.completions_skipped = counter(
            "completions_skipped", "Completions of a batch left out of training, by reason.", ("reason",)
        )
        self.completion_tokens = counter("completion_tokens", "Completion tokens trained on.")
        self.loss = gauge("loss", "GRPO loss of the latest batch (mean over its optimizer steps).")
        self.reward_mean = gauge("reward_mean", "Mean receiver reward of the latest batch's trained rows.")
        self.local_reward_mean = gauge(
            "local_reward_mean", "Mean reward of the latest batch's local rows (NaN when none)."
        )
        self.clip_fraction = gauge(
            "clip_fraction", "Share of completion tokens clipped in the latest batch, by side.", ("side",)
        )
        self.is_ratio = gauge(
            "is_ratio", "pi_old / pi_behaviour over importance-corrected tokens, by stat.", ("stat",)
        )
        self.is_truncated_fraction = gauge(
            "is_truncated_fraction", "Share of importance-corrected tokens whose weight hit is_cap."
        )
        self.entropy = gauge("entropy_nats", "Mean per-token policy entropy over completion tokens.")
        self.grad_norm = gauge("grad_norm", "Global L2 gradient norm before clipping (mean over steps).")
        self.learning_rate = gauge("learning_rate", "Learning rate after the latest optimizer step.")
        self.tokens_per_second = gauge(
            "tokens_per_second", "Completion tokens per second of the latest step."
        )
        self.policy_version = gauge("policy_version", "Policy version held in memory (batches applied).")
        self.announced_version = gauge(
            "announced_version", "Latest policy version checkpointed and announced."
        )
        self.step_seconds = Histogram(
            f"{P}_step_seconds", "Wall time of one batch's step(s).", buckets=STEP_BUCKETS, registry=registry
        )
        self.checkpoint_seconds = Histogram(
            f"{P}_checkpoint_seconds",
            "Wall time to publish one policy version (weights only; or verify a replayed one).",
            buckets=CHECKPOINT_BUCKETS,
            registry=registry,
        )
        self.state_seconds = Histogram(
            f"{P}_state_seconds",
            "Wall time to write one full trainer state (optimizer, schedule, RNG, offsets, ledger).",
            buckets=CHECKPOINT_BUCKETS,
            registry=registry,
        )
        self.versions_published = counter(
            "versions_published",
            "Policy versions published, by outcome: written; verified (a replayed version equal to the "
            "stored one); diverged (a replay differed: the stored weights were kept); skipped (a replay "
            "below the newest stored version that is no longer stored).",
            ("outcome",),
        )
        self.staleness = Histogram(
            f"{P}_staleness_versions",
            "Policy versions between a local group's sampler and the trainer at training time.",
            buckets=STALENESS_BUCKETS,
            registry=registry,
        )
        for outcome in BATCH_OUTCOMES:
            self.batches.labels(outcome)
        for outcome in PUBLISH_OUTCOMES:
            self.versions_published.labels(outcome)
        for mode in RowMode:
            self.sequences.labels(mode.value)
        for reason in SKIP_REASONS:
            self.completions_skipped.labels(reason)
        for side in ("low", "high"):
            self.clip_fraction.labels(side)
        for stat in ("mean", "min", "max"):
            self.is_ratio.labels(stat)

    def observe(self, report: StepReport) -> None:
        """Record one applied batch (trained or empty)."""
        built = report.built
        self.batches.labels("trained" if report.stats is not None else "empty").inc()
        if report.gap > 0:
            self.sequence_gaps.inc(report.gap)
        for row in built.rows:
            self.sequences.labels(row.mode.value).inc()
        self.sequences_truncated.inc(built.truncated)
        for reason, count in built.skipped.items():
            self.completions_skipped.labels(reason).inc(count)
        for staleness in built.staleness:
            self.staleness.observe(staleness)
        self.policy_version.set(report.version)
        self.step_seconds.observe(report.seconds)
        self.learning_rate.set(report.lr)
        self.reward_mean.set(built.reward_mean())
        self.local_reward_mean.set(built.reward_mean(local_only=True))
        stats = report.stats
        if stats is None:
            return
        m = stats.metrics
        self.steps.inc(stats.optimizer_steps)
        self.skipped_updates.inc(stats.skipped_updates)
        self.completion_tokens.inc(stats.completion_tokens)
        self.loss.set(m.loss)
        self.clip_fraction.labels("low").set(m.clip_fraction_low)
        self.clip_fraction.labels("high").set(m.clip_fraction_high)
        self.is_ratio.labels("mean").set(m.is_ratio_mean)
        self.is_ratio.labels("min").set(m.is_ratio_min)
        self.is_ratio.labels("max").set(m.is_ratio_max)
        self.is_truncated_fraction.set(m.is_truncated_fraction)
        self.entropy.set(m.entropy_mean)
        self.grad_norm.set(stats.grad_norm)
        seconds = report.seconds
        self.tokens_per_second.set(stats.completion_tokens / seconds if seconds > 0 else math.nan)
