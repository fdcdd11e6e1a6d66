"""The trainer service: consume training batches, step, checkpoint, announce, commit.

Delivery semantics (docs/architecture.md, Delivery; the training side is in `sapo.trainer.engine`):

- Input: `<prefix>.node.<id>.batches`, at-least-once. Idempotency key: the batch sequence (and id).
- Per batch: decode and validate (bad input is dead-lettered) -> skip duplicates -> train -> hold the
  record. Every `checkpoint_every` batches, and when idle with unpublished steps: publish the weights
  as a policy version -> `send_sync` the `PolicyUpdate` (compacted topic, key = node id). Every
  `state_every` versions, and when stopping: write the full trainer state beside the published
  version (after its announcement, so generators never wait for it) -> finish the held records ->
  commit. A crash replays the batches since the last full state: the consumer starts at the state's
  offsets (`on_assign`), not at the possibly older committed ones, so nothing is trained twice or
  skipped, and the replayed versions are verified against the published ones (`sapo.checkpoints`).
- On start: resume from the newest full state, or write version 0 (the initial weights) with a
  state; then announce the newest stored version that reads, so a (re)starting generator never goes
  back to an older one while the trainer replays.
- One trainer replica per node: it owns the node's checkpoint directory and its policy versions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Self

from google.protobuf.timestamp_pb2 import Timestamp

from sapo.checkpoints import Published, Written
from sapo.cpugate import Gate, NoGate
from sapo.kafka import (
    ConsumerClient,
    ConsumerLoop,
    DeadLetters,
    Disposition,
    Publisher,
    Record,
    TransportMetrics,
)
from sapo.kafka.consumer import LOOP_REASONS
from sapo.kafka.metrics import catalogue
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag
from sapo.models import require_device, require_loadable
from sapo.node.build import build_trainer
from sapo.node.lease import LEASE_REASONS, Lease, node_lease
from sapo.node.metrics import TrainerMetrics
from sapo.node.peers import PeerLabels
from sapo.node.planner import WorkPlanner
from sapo.node.quarantine import AttemptLog, is_poison, next_attempt, stepped
from sapo.ops import Health
from sapo.runtime import Runtime
from sapo.settings import ConfigError, env_prefix
from sapo.storage import CREDENTIALS_HINT, refused_access, store_problem
from sapo.topics import TopicNames
from sapo.trainer import StepReport, Trainer, step_metrics
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2, policy_pb2
from sapo.wire import (
    BATCH_REASONS,
    DECODE_REASONS,
    SCHEMA_VERSION,
    InvalidMessageError,
    decode,
    message_headers,
    validate_batch,
)

log = logging.getLogger(__name__)

SERVICE = "trainer"
READY_CONDITIONS = ("model_loaded", "partitions_assigned")
OFFSET_QUERY_TIMEOUT_S = 30.0
BATCH_REFUSALS = (
    *DECODE_REASONS,
    *BATCH_REASONS,
    "wrong_node",
    "fenced_batch",
    "epoch_beyond_leases",
    "sequence_gap_too_large",
    "late_batch",
    "poison_batch",
)
"""Every reason the trainer refuses (dead-letters) a batch for."""
REFUSALS = catalogue(LOOP_REASONS, BATCH_REFUSALS, LEASE_REASONS)
"""Every reason the trainer's loops reject or dead-letter a record for (`sapo.kafka.TransportMetrics`)."""


def checked_batch(record: Record, node_id: str, max_bytes: int) -> batch_pb2.TrainingBatch:
    """Decode and validate one batch. A batch without groups is valid: it advances the version. Its
    node is the one its body names: nothing here acts on the routing headers, so they are not compared
    (docs/contract.md section 3.1)."""
    batch = decode(batch_pb2.TrainingBatch, record.value, max_bytes)
    problem = validate_batch(batch)
    if problem is not None:
        raise InvalidMessageError(problem)
    if batch.node_id != node_id:
        raise InvalidMessageError("wrong_node", f"batch for {batch.node_id!r} reached {node_id!r}")
    return batch


def offsets_beyond_end(
    stored: Mapping[TopicPartition, int], bounds: Mapping[TopicPartition, tuple[int, int]]
) -> dict[TopicPartition, int]:
    """Where to restart each partition whose stored offset lies beyond its end: its first offset. A
    partition the broker does not know counts as empty."""
    restart: dict[TopicPartition, int] = {}
    for tp, offset in stored.items():
        first, end = bounds.get(tp, (0, 0))
        if offset > end:
            restart[tp] = first
    return restart


class TrainerService:
    """Wires a `Trainer` to the batch stream, the policy topic, health and metrics."""

    def __init__(
        self,
        settings: TrainerSettings,
        trainer: Trainer,
        *,
        client: ConsumerClient,
        publisher: Publisher,
        topics: TopicNames,
        health: Health,
        metrics: TrainerMetrics,
        transport: TransportMetrics,
        stop: StopFlag,
        dead_letters: DeadLetters | None = None,
        lease: Lease | None = None,
        poll_timeout_s: float = 1.0,
        gate: Gate | None = None,
    ) -> None:
        self.settings = settings
        self.trainer = trainer
        self.gate: Gate = gate or NoGate()
        """Each step runs in a slot of the host-wide compute gate (`sapo.cpugate`)."""
        self.lease = lease
        self.publisher = publisher
        self.topics = topics
        self.health = health
        self.metrics = metrics
        self.stop = stop
        self._client = client
        self.dead_letters = dead_letters
        self.attempts = AttemptLog(trainer.store.node_dir(settings.node_id), trainer.store.digest)
        self.loop = ConsumerLoop(
            client,
            [topics.batches],
            self.handle,
            stop=stop,
            metrics=transport,
            dead_letters=dead_letters,
            stream_of=lambda topic: "batches",
            on_idle=self.on_idle,
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            poll_timeout_s=poll_timeout_s,
            max_payload_bytes=settings.max_payload_bytes,
            contain_errors=False,  # a failing step is retried and quarantined by attempts instead
        )
        self._held: list[Record] = []
        self._announced = -1
        self._published = -1
        self._stored = True  # whether the published version is in the store (a full state needs it)
        self._last_report: StepReport | None = None
        self._batch_epoch = 0  # the highest sampler epoch seen: a lower one is a fenced sampler's
        epoch = lease.epoch if lease is not None else 0
        self.planner = WorkPlanner(
            publisher,
            topics.work,
            settings.node_id,
            per_round=settings.questions_per_round,
            pacing=settings.pacing(),
            flush_timeout_s=settings.announce_timeout_s,
            epoch=epoch,
        )
        health.require(*READY_CONDITIONS)
        health.set_max_silence(settings.step_max_silence_s)  # model loading and resume come first

    @classmethod
    def prepare(cls, settings: TrainerSettings) -> Callable[[Runtime], Self | None]:
        """The model and the device are on this machine and the checkpoint store can be used: checked
        before any connection opens, so a missing one fails at start with what to set. Returns what
        wires the service to a runtime (`from_runtime`)."""
        require_loadable(settings.model, f"{env_prefix(settings)}MODEL")
        require_device(settings.device, f"{env_prefix(settings)}DEVICE")
        problem = store_problem(settings.checkpoint_root)
        if problem is not None:
            setting = f"{env_prefix(settings)}CHECKPOINT_ROOT"
            raise ConfigError(
                f"{setting}={settings.checkpoint_root!r}: {problem}; set {setting} to a writable directory "
                "or a store URL fsspec reads (s3://bucket/prefix with s3fs installed)"
            )
        return functools.partial(cls.from_runtime, settings)

    @classmethod
    def from_runtime(cls, settings: TrainerSettings, runtime: Runtime) -> Self | None:
        """Take the node's trainer lease (a standby waits), load the model, resume (or write version 0)
        and announce it: ready to consume. None when stopped while waiting for the lease."""
        lease = node_lease(runtime, settings, SERVICE)
        if not lease.acquire():  # resume reads the store only once no other trainer writes it
            return None
        runtime.health.set_max_silence(settings.step_max_silence_s)  # the first model load can be slow
        service = cls(
            settings,
            build_trainer(settings),
            client=runtime.consumer(SERVICE),
            publisher=runtime.publisher,
            topics=runtime.topics,
            health=runtime.health,
            metrics=TrainerMetrics(runtime.registry, PeerLabels(settings.node_id, settings.metrics_peers)),
            transport=runtime.transport,
            stop=runtime.stop,
            dead_letters=runtime.dead_letters,
            lease=lease,
            gate=runtime.gate,
        )
        service.start()
        return service

    def start(self) -> None:
        """Resume or write version 0, announce it, and become ready to consume."""
        log.info(
            "training %s on %s: lr %.3g (%s schedule, warmup %d), precision %s, steps_per_batch %d",
            self.settings.model,
            self.settings.device,
            self.trainer.lr,
            self.settings.lr_schedule,
            self.settings.warmup_steps,
            self.settings.precision,
            self.settings.steps_per_batch,
        )
        try:
            written, resumed = self.trainer.initialize()
        except Exception as exc:
            if not refused_access(self.trainer.store.root, exc):
                raise
            setting = f"{env_prefix(self.settings)}CHECKPOINT_ROOT"
            raise ConfigError(
                f"{setting}={self.settings.checkpoint_root!r}: the store refused access ({exc}); "
                f"{CREDENTIALS_HINT}"
            ) from None
        log.info("%s version %d", "resumed at" if resumed else "wrote initial", self.trainer.version)
        if resumed:  # before the announcement: nothing new can be on the batch topic yet
            self._restart_recreated_partitions()
        self._published = self.trainer.version
        # Not the newest stored one: a host crash may have torn its manifest, and failing on it would
        # fail every start (the replay writes it again).
        newest = self.trainer.store.latest_readable(self.settings.node_id) if resumed else None
        ahead = newest is not None and newest.manifest.version > self.trainer.version
        self._announce(newest if ahead and newest is not None else written)
        self.metrics.policy_version.set(self.trainer.version)
        self.metrics.learning_rate.set(self.trainer.lr)
        self.health.set("model_loaded", True)
        self.health.set_max_silence(self.settings.idle_max_silence_s)
        self.health.beat()

    def run(self, *, until: Callable[[], bool] | None = None, idle_timeout_s: float | None = None) -> None:
        """Consume until stopped (SIGTERM; or `until()`, or idle for `idle_timeout_s`: tests), then
        checkpoint what is unsaved and leave the group."""
        try:
            self.loop.run(until=until, idle_timeout_s=idle_timeout_s, close=False)
            self.flush()
        finally:
            self.loop.close()

    def close(self) -> None:
        """Leave the batch topic's group (`run` already did unless it was never started) and give the
        lease up, so a standby takes over at once."""
        try:
            self.loop.close()
        finally:
            if self.lease is not None:
                self.lease.release()

    def handle(self, record: Record) -> Disposition:
        batch = checked_batch(record, self.settings.node_id, self.settings.max_payload_bytes)
        if batch.epoch < self._batch_epoch:
            raise InvalidMessageError(
                "fenced_batch", f"batch {batch.batch_id} of sampler epoch {batch.epoch} < {self._batch_epoch}"
            )
        if self.lease is not None and not self.lease.vouches(batch.epoch):
            if self.stop.is_set():  # the read for its acquisition was cut short: the next trainer judges it
                log.info(
                    "batch %s left unfinished: stopped before its sampler epoch was read", batch.batch_id
                )
                return Disposition.HELD  # never finished: not committed, read again after the restart
            raise InvalidMessageError(  # it would make every later batch look fenced
                "epoch_beyond_leases",
                f"batch {batch.batch_id} of sampler epoch {batch.epoch}: the leases topic ends at offset "
                f"{self.lease.end}, so no sampler holds a lease of that epoch",
            )
        self._batch_epoch = batch.epoch
        if self.lease is not None:
            self.lease.check()
        if self.trainer.is_duplicate(batch):
            log.info("batch %s (sequence %d) already trained; skipped", batch.batch_id, batch.sequence)
            self.metrics.batches.labels("duplicate").inc()
            self.trainer.note_offset(record.tp, record.offset + 1)
            return Disposition.DONE
        gap = int(batch.sequence) - self.trainer.state.next_sequence
        if gap > self.settings.max_sequence_gap:
            raise InvalidMessageError(
                "sequence_gap_too_large",
                f"batch {batch.batch_id} (sequence {batch.sequence}) is {gap} ahead of the next expected "
                f"sequence {self.trainer.state.next_sequence}, more than SAPO_TRAINER_MAX_SEQUENCE_GAP="
                f"{self.settings.max_sequence_gap}",
            )
        if self.trainer.is_late(batch):
            self.trainer.note_offset(record.tp, record.offset + 1)  # a restart need not refuse it again
            raise InvalidMessageError(
                "late_batch",
                f"batch {batch.batch_id} (sequence {batch.sequence}) arrived after sequence "
                f"{self.trainer.state.next_sequence - 1} was trained as version {self.trainer.version}: "
                "versions follow sequence, so it is not trained",
            )
        with self._busy():
            report = self._step(record, batch)
            self.trainer.note_offset(record.tp, record.offset + 1)
            self._held.append(record)
            self._last_report = report
            self.metrics.observe(report)
            self._log_step(report)
            due = self.trainer.version - self._published >= self.settings.checkpoint_every
            if due or self.stop.is_set():
                self._checkpoint_and_release()
        return Disposition.HELD

    def _step(self, record: Record, batch: batch_pb2.TrainingBatch) -> StepReport:
        """Train on the batch, or quarantine it when its step already failed `max_step_attempts` times
        (`sapo.node.quarantine`). A failing step records its error and stops the service; a step that
        succeeds is marked so, or kills before a full state covers the batch would count against it."""
        previous = self.attempts.read()
        if is_poison(previous, batch.batch_id, self.settings.max_step_attempts):
            assert previous is not None
            detail = f"{previous.attempts} attempts; last error: {previous.error or 'the process died'}"
            log.error("batch %s quarantined as poison_batch: %s", batch.batch_id, detail)
            if self.dead_letters is not None:
                self.dead_letters.send(record, "poison_batch", detail)
            return self.trainer.skip(batch)
        attempt = next_attempt(previous, batch.batch_id, int(batch.sequence))
        if attempt is not None:
            self.attempts.write(attempt)
        try:
            with self.gate.hold():
                report = self.trainer.apply(batch)
        except Exception as exc:
            if attempt is not None:
                self.attempts.write(replace(attempt, error=f"{type(exc).__name__}: {exc}"))
            log.exception(
                "step of batch %s failed (attempt %s)", batch.batch_id, attempt and attempt.attempts
            )
            raise
        if attempt is not None:
            self.attempts.write(stepped(attempt))
        return report

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        """Widen the liveness window for a step or a checkpoint, which block the poll loop."""
        self.health.set_max_silence(self.settings.step_max_silence_s)
        try:
            yield
        finally:
            self.health.set_max_silence(self.settings.idle_max_silence_s)
            self.health.beat()

    def flush(self) -> None:
        """Publish unpublished steps and write the full state, then release their records for commit."""
        if self.trainer.version == self._published == self.trainer.state_version:
            return
        with self._busy():
            self._checkpoint_and_release(final=True)

    def _checkpoint_and_release(self, *, final: bool = False) -> None:
        """Publish and announce unpublished steps; write the full state when due (or `final`), and only
        then finish the held records and commit their offsets."""
        if self.lease is not None:
            self.lease.check(before_write=True)  # a fenced trainer stops here, before it writes
        if self.trainer.version > self._published:
            started = time.perf_counter()
            with self._store_write():
                published = self.trainer.publish()
            self.metrics.checkpoint_seconds.observe(time.perf_counter() - started)
            self.metrics.versions_published.labels(published.outcome).inc()
            self._published = self.trainer.version
            self._stored = published.written is not None  # skipped: a replay below the newest version
            self._announce_published(published)
        due = self.trainer.version - self.trainer.state_version >= self.settings.state_every
        if not self._stored or self.trainer.version == self.trainer.state_version:
            return
        if not (due or final or self.stop.is_set()):
            return
        started = time.perf_counter()
        with self._store_write():
            self.trainer.save_state()
        seconds = time.perf_counter() - started
        self.metrics.state_seconds.observe(seconds)
        log.info("wrote the full state of version %d in %.2fs", self.trainer.version, seconds)
        for record in self._held:
            self.loop.finish(record)
        self._held.clear()
        self.loop.commit()

    @contextlib.contextmanager
    def _store_write(self) -> Iterator[None]:
        """A store that refuses a write (full, read-only, unreachable) stops the service, as a failed
        step does: the restart resumes from the last full state once the store takes writes again. The
        batch whose step succeeded was marked so (`quarantine.stepped`, by `_step`): restarts failing
        on the store do not quarantine it as poison."""
        try:
            yield
        except Exception as exc:
            log.error(
                "cannot write version %d to the checkpoint store %s (%s: %s): stopping; a restart "
                "resumes from the last full state once the store takes writes again (free space, or "
                "fix %sCHECKPOINT_ROOT)",
                self.trainer.version,
                self.trainer.store.root.uri(),
                type(exc).__name__,
                exc,
                env_prefix(self.settings),
            )
            raise

    def _announce_published(self, published: Published) -> None:
        written = published.written
        # A version written at or below the announced one replaced a torn one (`sapo.checkpoints`): its
        # manifest is new, and generators hold the announcement of the old one, which no longer loads.
        rewritten = published.outcome == "written"
        if written is None or (written.manifest.version <= self._announced and not rewritten):
            log.info("version %d %s, not announced again", self.trainer.version, published.outcome)
            return
        self._announce(written)

    def on_idle(self) -> None:
        self.health.beat()
        if self.lease is not None:
            self.lease.check()
        if self.trainer.version > self._published:
            with self._busy():  # a lock-step sampler waits for this version before it sends the next batch
                self._checkpoint_and_release()

    def _restart_recreated_partitions(self) -> None:
        """Read a batch partition from its beginning when the offset the state stores lies beyond its
        end: the topic was deleted and created again (a reinstall that kept the checkpoints, or a new
        Kafka cluster). Seeking there would wait forever on a broker that answers such a fetch with
        nothing (the embedded one) and fall back to auto.offset.reset on Apache Kafka; either way it
        is told here, counted and logged. A false alarm (the embedded broker can report an end that is
        too low) only costs a re-read: trained batches are skipped by their sequence."""
        stored = self.trainer.state.offsets
        if not stored:
            return
        bounds = self._client.offset_bounds(list(stored), OFFSET_QUERY_TIMEOUT_S)
        for tp, start in offsets_beyond_end(stored, bounds).items():
            end = bounds.get(tp, (0, 0))[1]
            log.warning(
                "stored input offset %d of %s/%d is beyond the end of the partition (%d): the batch "
                "topic was re-created; reading it from offset %d, batches up to sequence %d are skipped "
                "as trained",
                stored[tp],
                tp[0],
                tp[1],
                end,
                start,
                self.trainer.state.next_sequence - 1,
            )
            self.metrics.input_offsets_reset.inc()
            self.trainer.restart_offset(tp, start)

    def on_assign(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Start every partition at the offset the weights in memory reflect (the checkpoint's on start)."""
        self.health.set("partitions_assigned", True)
        offsets = self.trainer.state.offsets
        starts = {tp: offsets[tp] for tp in tps if tp in offsets}
        log.info("assigned %s; starting at %s (others at the committed offset)", tps, starts)
        return starts

    def on_revoke(self, tps: list[TopicPartition]) -> None:
        self.health.set("partitions_assigned", bool(self.loop.assigned.difference(tps)))

    def _announce(self, written: Written) -> None:
        manifest = written.manifest
        created = Timestamp()
        created.FromNanoseconds(int(manifest.created_at * 1e9))
        update = policy_pb2.PolicyUpdate(
            schema_version=SCHEMA_VERSION,
            node_id=self.settings.node_id,
            version=manifest.version,
            manifest_uri=written.manifest_uri,
            manifest_sha256=written.manifest_sha256,
            created_at=created,
            batch_id=str(manifest.meta.get("batch_id", "")),
            epoch=self.lease.epoch if self.lease is not None else 0,
        )
        sequence = int(manifest.meta.get("sequence", -1))
        if sequence >= 0:  # the sampler numbers its next batch after it (sapo.node.trained)
            update.sequence = sequence
        report = self._last_report
        if report is not None and report.version == manifest.version:
            update.metrics.CopyFrom(step_metrics(report))
        value = update.SerializeToString()
        node = self.settings.node_id
        if self.lease is not None:
            self.lease.check(before_write=True)
        self.publisher.send_sync(
            self.topics.policy,
            node.encode(),
            value,
            message_headers("PolicyUpdate", node, value),
            timeout_s=self.settings.announce_timeout_s,
        )
        self._announced = manifest.version
        self.metrics.announced_version.set(manifest.version)
        log.info("announced version %d: %s", manifest.version, written.manifest_uri)
        planned = self.planner.plan(manifest.version)
        if planned:
            self.metrics.planned_round.set(planned.stop - 1)

    def _log_step(self, report: StepReport) -> None:
        stats = report.stats
        if stats is None:
            log.info("version %d: batch %s had nothing to train; no update", report.version, report.batch_id)
            return
        m = stats.metrics
        log.info(
            "version %d: batch %s, %d rows, %d tokens, loss %.4f, reward %.3f, clip %.3f/%.3f, "
            "is_mean %.3f, entropy %.3f, grad_norm %.3f, lr %.3g, %.2f s",
            report.version,
            report.batch_id,
            len(report.built.rows),
            stats.completion_tokens,
            m.loss,
            report.built.reward_mean(),
            m.clip_fraction_low,
            m.clip_fraction_high,
            m.is_ratio_mean,
            m.entropy_mean,
            stats.grad_norm,
            report.lr,
            report.seconds,
        )
