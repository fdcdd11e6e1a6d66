"""Metrics of the three services, each declared once on its process's registry.

Names follow `sapo_<service>_<noun>_<unit>`: counters end in `_total`, durations are histograms in
seconds. Every label is bounded (task names from the node's profile, reasons and origins from fixed
tuples) and initialised up front, so dashboards see zeros rather than missing series. Transport-level
counts (messages read, dead-lettered, produced) come from `sapo.kafka.TransportMetrics` on the same
registry, with every reason the service refuses a record for (its `REFUSALS`) at 0 from the start.
Per-peer series (`sapo.node.peers`) bound their `peer` label by the METRICS_PEERS setting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sapo.kafka.metrics import LoopCounter
from sapo.node.peers import PeerLabels, SamplerPeerMetrics, TrainerPeerMetrics
from sapo.sampler import ORIGINS, REASONS, RoundMode
from sapo.sampler.configs import WINDOW_S

if TYPE_CHECKING:
    from sapo.trainer import StepReport

# --- generator ---

WORK_OUTCOMES = ("generated", "obsolete", "duplicate")
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
        self.round = Gauge(f"{p}_round", "Highest round this replica generated so far.", registry=registry)
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
        self.work_items = Counter(
            f"{p}_work_items_total",
            "Work items by outcome: generated (group acknowledged), obsolete (the swarm moved past the "
            "round), duplicate (the same item held twice).",
            ["outcome"],
            registry=registry,
        )
        self.work_held = Gauge(
            f"{p}_work_held_items",
            "Work items this replica holds, waiting for their policy.",
            registry=registry,
        )
        self.work_partitions = Gauge(
            f"{p}_work_partitions",
            "Work topic partitions assigned to this replica (0: more replicas than partitions, it idles).",
            registry=registry,
        )
        for reason in LOAD_FAILURE_REASONS:
            self.weight_load_failures.labels(reason)
        for outcome in WORK_OUTCOMES:
            self.work_items.labels(outcome)
        for reason in RETRY_REASONS:
            self.weight_load_retries.labels(reason)


# --- sampler ---

SOURCES = ("local", "external")
_COUNT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_VERSION_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)
_AGE_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class SamplerMetrics:
    def __init__(self, registry: CollectorRegistry, peers: PeerLabels | None = None) -> None:
        self.peers = SamplerPeerMetrics(registry, peers or PeerLabels("", 0))
        # Counted for every record read (`sapo.kafka.metrics.LoopCounter`).
        self.consumed = LoopCounter(
            "sapo_sampler_groups_consumed_total",
            "Rollout groups read, by origin (local: own generator; external: the swarm topic).",
            ["origin"],
            registry,
        )
        self.rejected = LoopCounter(
            "sapo_sampler_groups_rejected_total",
            "Groups not used, by reason: filters (header, malformed, verification, freshness, dedupe, "
            "signal) and pool discards (expired, evicted, unused, late_round, future_round).",
            ["reason"],
            registry,
        )
        self.batches = Counter(
            "sapo_sampler_batches_emitted_total",
            "Training batches acknowledged by the broker.",
            registry=registry,
        )
        self.waited_out = Counter(
            "sapo_sampler_batches_waited_out_total",
            "Batches that went when their wait for the swarm ran out (lockstep_timeout_s, deadline_s, "
            "async_timeout_s) before expected_peers peers sent what they waited for, by round mode: in "
            "lockstep and async, fewer peers than expected_peers are live or keep pace.",
            ["mode"],
            registry=registry,
        )
        self.sequence_jumps = Counter(
            "sapo_sampler_sequence_jumps_total",
            "Times the batch sequence moved forward to where the trainer expects it (the node's batch "
            "topic lost its history while the checkpoints stayed).",
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
        self.warm_read = Counter(
            "sapo_sampler_warm_start_groups_read_total",
            "Records of the swarm topic's history read by warm start (sapo.sampler.warm).",
            registry=registry,
        )
        self.warm_used = Counter(
            "sapo_sampler_warm_start_groups_used_total",
            "History groups in acknowledged warm-start batches.",
            registry=registry,
        )
        self.warm_rejected = Counter(
            "sapo_sampler_warm_start_groups_rejected_total",
            "History groups warm start did not use, by reason (the live filters' reasons, evicted by "
            "newer ones beyond WARM_START__MAX_GROUPS, unused by any batch).",
            ["reason"],
            registry=registry,
        )
        self.warm_batches = Counter(
            "sapo_sampler_warm_start_batches_total",
            "Warm-start batches acknowledged by the broker (empty ones included: lock-step rounds "
            "without a usable history group).",
            registry=registry,
        )
        self.pool = Gauge(
            "sapo_sampler_pool_groups",
            "Groups waiting in the pool for a batch, by origin.",
            ["origin"],
            registry=registry,
        )
        self.pool_of = {origin: self.pool.labels(origin) for origin in ORIGINS}  # set every step
        self.generator_configs = Gauge(
            "sapo_sampler_generator_configs",
            f"Distinct generator settings fingerprints (sapo-generator-config) on the node's own groups "
            f"within the last {WINDOW_S:.0f} s: above 1, its generator replicas run different settings "
            "(a rolling update, or a fault when it lasts).",
            registry=registry,
        )
        for origin in ORIGINS:
            self.consumed.labels(origin)
            self.age.labels(origin)
            self.pool.labels(origin)
        for reason in REASONS:
            self.rejected.labels(reason)
            self.warm_rejected.labels(reason)
        for source in SOURCES:
            self.batch_groups.labels(source)
        for mode in RoundMode:
            self.waited_out.labels(mode)


# --- trainer ---

P = "sapo_trainer"
SKIP_REASONS = (
    "error",
    "bad_logprobs",
    "bad_token_id",
    "bad_question",
    "bad_temperature",
    "prompt_too_long",
    "empty",
)
BATCH_OUTCOMES = ("trained", "empty", "duplicate", "quarantined")
PUBLISH_OUTCOMES = ("written", "verified", "diverged", "skipped")
STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
CHECKPOINT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32)


class TrainerMetrics:
    """The trainer's metrics. `sapo.trainer` loads torch, so it is imported where the trainer's metrics
    need it, not at the top: the sampler and the generator import this module too."""

    def __init__(self, registry: CollectorRegistry, peers: PeerLabels | None = None) -> None:
        from sapo.trainer import RowMode

        self.peers = TrainerPeerMetrics(registry, peers or PeerLabels("", 0))

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"{P}_{name}", doc, labels, registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{P}_{name}", doc, labels, registry=registry)

        self.steps = counter("steps", "Optimizer steps applied (several per batch with steps_per_batch > 1).")
        self.planned_round = gauge("planned_round", "Highest round whose work items were published.")
        self.skipped_updates = counter(
            "nonfinite_updates", "Optimizer steps not applied because the gradient norm was not finite."
        )
        self.batches = counter("batches", "Training batches consumed, by outcome.", ("outcome",))
        self.input_offsets_reset = counter(
            "input_offsets_reset",
            "Batch partitions read again from their beginning at start because the offset the state "
            "stores lies beyond their end (the batch topic was re-created).",
        )
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
        self.step_cpu_seconds = Histogram(
            f"{P}_step_cpu_seconds",
            "CPU time of the trainer's process during one batch's step(s), all threads: well below the "
            "step's wall time, the step waited for a CPU.",
            buckets=STEP_BUCKETS,
            registry=registry,
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
        """Record one applied batch (trained, empty or quarantined)."""
        built = report.built
        outcome = "quarantined" if report.quarantined else "trained" if report.stats is not None else "empty"
        self.batches.labels(outcome).inc()
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
        if not report.quarantined:  # no step was taken to time
            self.step_seconds.observe(report.seconds)
            self.step_cpu_seconds.observe(report.cpu_seconds)
        self.learning_rate.set(report.lr)
        self.reward_mean.set(built.reward_mean())
        self.local_reward_mean.set(built.reward_mean(local_only=True))
        stats = report.stats
        if stats is None:
            return
        from sapo.trainer.contributions import contributions

        m = stats.metrics
        self.steps.inc(stats.optimizer_steps)
        self.peers.observe(contributions(built.rows))
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
