"""Following the node's compacted policy topic and hot-swapping verified weights into the backend.

The generator reads `sapo.node.<id>.policy` with a reader in no consumer group (one per process:
`sapo.kafka.KafkaReaderClient`), so every replica sees the whole topic from the beginning; offsets are
irrelevant to correctness. Updates are only noted while records are read; the newest one is loaded after
the read, between rounds, so a burst of versions that arrived during a long round costs one load, not
one per version.

A version is loaded only after its manifest matches the announced sha256 and every shard matches the
manifest (`sapo.checkpoints`, verified while read), and only if every tensor fits the model. The read
and the verification run on a thread of their own (one at a time): the loop waits for them up to
`LOAD_HOLD_S`, so a load that finishes within it serves the very next batch as before, and one from a
slow or silent store goes on while the loop serves work with the weights it has (and keeps beating
its liveness); the verified weights are swapped in on the loop's thread, between batches. Any
failure leaves the old weights in place and is logged. A transient one (an object not visible yet, a
store that did not answer) is retried with bounded backoff and counted per retry; a permanent one
(digest mismatch, malformed, incompatible) or a version that stays unreadable past the give-up bound
is rejected and counted by reason, and only a newer announcement can fix it (`sapo.generator.reload`).

The follower keeps the newest few announced versions above the loaded one that are neither loaded nor
rejected (its candidates) and tries them newest first: while one is retried, a lower candidate still
loads, so one announcement that never becomes loadable (a bogus version, a checkpoint lost) holds back
neither the versions announced around it nor, after a restart, the catch-up. Readiness (`weights_ok`)
is false while a candidate is left or while held work waits for an announced version that is not
loaded (it was rejected); liveness fails once that lasts longer than `max_behind_s`. A rejected
version nothing waits for is counted and alerted on, and leaves the generator ready.

An update the follower refuses (undecodable, incomplete, another node's, a fenced trainer's) is counted
by reason (`messages_rejected_total`) and dead-lettered only when it arrived after this process started
(the loop's `history` reading, `sapo.kafka.consumer`): every start reads the topic again from its
beginning, and each replica that reads a refused update as it arrives dead-letters it (they are peers
with no lease to elect one; the copies name the same `sapo-dlq-source`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError

from sapo.backends import GenerationBackend
from sapo.checkpoints import CheckpointError, load_weights, read_manifest
from sapo.generator import ReloadPolicy, Retry, is_transient
from sapo.kafka import ConsumerClient, ConsumerLoop, DeadLetters, Disposition, Record, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.node.metrics import GeneratorMetrics
from sapo.ops import Health
from sapo.v1 import policy_pb2
from sapo.wire import (
    DECODE_REASONS,
    POLICY_UPDATE_REASONS,
    InvalidMessageError,
    decode,
    validate_policy_update,
)

log = logging.getLogger(__name__)

WEIGHTS_OK = "weights_ok"
WEIGHTS_CURRENT = "weights_current"  # the liveness deadline's name
_MAX_DRAIN = 1000
_WARN_EVERY_S = 30.0
LOAD_HOLD_S = 2.0
"""How long the loop waits for a load it starts before going on with the weights it has: longer than a
verified load of the bundled 135M model from local disk (under a second), so those stay synchronous."""
_SETTLE_SLICE_S = 0.2
MAX_CANDIDATES = 8
"""Announced versions kept for loading; the lowest gives way to a newer one (it would be superseded)."""
POLICY_REASONS = (*DECODE_REASONS, *POLICY_UPDATE_REASONS, "foreign_node", "fenced_update")
"""Every reason `PolicyFollower` refuses an update for."""


class IncompatibleWeightsError(ValueError):
    """Weights that do not fit the running model (other architecture or size)."""


def failure_reason(exc: Exception) -> str:
    """A bounded metric label for a failed load (see `metrics.LOAD_FAILURE_REASONS`)."""
    if isinstance(exc, CheckpointError):
        known = ("digest_mismatch", "missing", "unavailable", "malformed")
        return exc.reason if exc.reason in known else "checkpoint"
    if isinstance(exc, SafetensorError):
        return "malformed"
    if isinstance(exc, OSError):
        return "missing"
    return "incompatible"  # ValueError / RuntimeError from the shape check or the backend


def check_shapes(state: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a state dict with a tensor the model lacks or shaped differently, before any is copied:
    `load_state_dict` copies the fitting tensors before it reports the others, leaving a hybrid model."""
    for name, tensor in state.items():
        expected = shapes.get(name)
        if expected is None or tuple(tensor.shape) != expected:
            raise IncompatibleWeightsError(
                f"tensor {name} has shape {tuple(tensor.shape)}, the model expects {expected}"
            )


@dataclass
class Candidate:
    """An announced version above the loaded one, neither loaded nor rejected yet; `retry` once a load
    of it failed transiently."""

    update: policy_pb2.PolicyUpdate
    retry: Retry | None = None

    def due(self, now: float) -> bool:
        return self.retry is None or now >= self.retry.next_at


def same_checkpoint(a: policy_pb2.PolicyUpdate, b: policy_pb2.PolicyUpdate) -> bool:
    return a.manifest_uri == b.manifest_uri and a.manifest_sha256 == b.manifest_sha256


_TOLERATED = (CheckpointError, SafetensorError, OSError, ValueError, RuntimeError)
"""What a bad checkpoint raises; it must not take the generator down (the old weights stay)."""


@dataclass
class Fetch:
    """One version's manifest and weights, read and verified on a thread of its own."""

    update: policy_pb2.PolicyUpdate
    shapes: Mapping[str, tuple[int, ...]] | None
    started: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)
    state: dict[str, torch.Tensor] | None = None
    error: Exception | None = None

    def start(self) -> Fetch:
        # A daemon: a read from a store that never answers must not hold the process's exit.
        threading.Thread(target=self._run, name=f"policy-load-v{self.update.version}", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            self.state = read_verified(self.update, self.shapes)
        except Exception as exc:  # handed to the loop's thread, which tolerates or raises it
            self.error = exc
        finally:
            self.done.set()


def read_verified(
    update: policy_pb2.PolicyUpdate, shapes: Mapping[str, tuple[int, ...]] | None
) -> dict[str, torch.Tensor]:
    """The weights `update` announces, verified against its manifest and, given `shapes`, the model."""
    manifest, directory = read_manifest(update.manifest_uri, update.manifest_sha256)
    if manifest.node_id != update.node_id or manifest.version != update.version:
        raise CheckpointError(
            "malformed",
            f"malformed manifest: it describes {manifest.node_id} v{manifest.version}, "
            f"the update announced {update.node_id} v{update.version}",
        )
    # Tied copies are left out: the model ties them itself (the backend checks coverage).
    state = load_weights(manifest, directory, tied=False)
    if shapes is not None:
        check_shapes(state, shapes)
    return state


class PolicyFollower:
    """Reads PolicyUpdates with a `ConsumerLoop` driven by `step()`, and loads the newest one."""

    def __init__(
        self,
        client: ConsumerClient,
        *,
        topic: str,
        node_id: str,
        backend: GenerationBackend,
        metrics: GeneratorMetrics,
        transport: TransportMetrics,
        health: Health,
        stop: StopFlag,
        max_payload_bytes: int,
        catchup_idle_s: float,
        reload: ReloadPolicy,
        dead_letters: DeadLetters | None = None,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        poll_timeout_s: float = 0.2,
    ) -> None:
        self._loop = ConsumerLoop(
            client,
            [topic],
            self._handle,
            stop=stop,
            metrics=transport,
            dead_letters=dead_letters,
            stream_of=lambda _topic: "policy",
            history=True,
            poll_timeout_s=poll_timeout_s,
            max_payload_bytes=max_payload_bytes,
        )
        self._topic = topic
        self._node_id = node_id
        self._backend = backend
        self._metrics = metrics
        self._health = health
        self._stop = stop
        self._max_bytes = max_payload_bytes
        self._catchup_idle_s = catchup_idle_s
        self._shapes = shapes
        self._reload = reload
        self._candidates: dict[int, Candidate] = {}
        self._fetch: Fetch | None = None
        self._epoch = 0
        self._behind = False
        self._wanted: int | None = None
        self.announced = backend.model_version
        """Newest version announced for this node, loaded or not."""
        health.require(WEIGHTS_OK)
        metrics.policy_version.set(backend.model_version)

    @property
    def loaded(self) -> int:
        return self._backend.model_version

    def open(self) -> None:
        self._loop.open()

    def close(self) -> None:
        self._loop.close()

    def catch_up(self) -> bool:
        """Read the topic from the beginning and load its newest version; False if stopped first.

        "Caught up" = assigned, then nothing new for `catchup_idle_s` (watermarks are not trusted).
        """
        idle_since = warned = time.monotonic()
        while not self._stop.is_set():
            self._health.beat()
            got = self._loop.step()
            now = time.monotonic()
            if got or not self._loop.assigned:
                idle_since = now
                if not self._loop.assigned and now - warned > _WARN_EVERY_S:
                    log.warning("policy topic %s not assigned yet (does it exist?)", self._topic)
                    warned = now
            elif now - idle_since >= self._catchup_idle_s:
                if not self._settle():
                    return False
                self._track_behind()
                log.info("policy caught up: announced v%d, loaded v%d", self.announced, self.loaded)
                return True
        return False

    def poll(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for updates (or for the load under way), take everything already
        fetched, load the newest."""
        if self._fetch is not None:  # what the loop waits for now; updates queue meanwhile
            self._fetch.done.wait(timeout_s)
            timeout_s = 0.0
        got = self._loop.step(timeout_s)
        for _ in range(_MAX_DRAIN):
            if not got:
                break
            got = self._loop.step(0.0)
        self._apply_pending(LOAD_HOLD_S)
        self._track_behind()

    def wanted(self, version: int | None) -> None:
        """The lowest version held work waits for (None: nothing waits); readiness follows it."""
        self._wanted = version
        self._track_behind()

    def _handle(self, record: Record) -> Disposition:
        update = decode(policy_pb2.PolicyUpdate, record.value, self._max_bytes)
        reason = validate_policy_update(update)
        if reason is not None:
            raise InvalidMessageError(reason)
        if update.node_id != self._node_id:
            raise InvalidMessageError(
                "foreign_node", f"update for {update.node_id!r} on {self._node_id}'s topic"
            )
        if update.epoch < self._epoch:  # written by a trainer another one fenced out (sapo.node.lease)
            raise InvalidMessageError(
                "fenced_update", f"v{update.version} of trainer epoch {update.epoch} < {self._epoch}"
            )
        self._epoch = update.epoch
        self.announced = max(self.announced, update.version)
        self._metrics.announced_version.set(self.announced)
        if update.version > self.loaded:
            self._note(update)
        return Disposition.DONE

    def _note(self, update: policy_pb2.PolicyUpdate) -> None:
        """Keep `update` as a candidate; the same checkpoint announced again keeps its retry state."""
        known = self._candidates.get(update.version)
        retry = known.retry if known is not None and same_checkpoint(known.update, update) else None
        self._candidates[update.version] = Candidate(update, retry)
        if len(self._candidates) > MAX_CANDIDATES:
            del self._candidates[min(self._candidates)]

    def _settle(self) -> bool:
        """Load until no candidate is due and no load is under way (the catch-up's blocking load);
        False if stopped first."""
        self._apply_pending(0.0)
        while self._fetch is not None:
            if self._stop.is_set():
                return False
            self._health.beat()
            self._fetch.done.wait(_SETTLE_SLICE_S)
            self._apply_pending(0.0)
        return True

    def _apply_pending(self, hold_s: float) -> None:
        """Finish the load under way if it is done; start one of the newest due candidate and wait up to
        `hold_s` (in all) for the loads started here; repeat while loads finish. Newest first, each one
        failing transiently is skipped until its backoff has passed, so a lower version loads while a
        higher one is retried."""
        deadline = time.monotonic() + hold_s
        while True:
            if self._fetch is None:
                self._fetch = self._start_due()
                if self._fetch is None:
                    break
                self._fetch.done.wait(max(0.0, deadline - time.monotonic()))
            if not self._fetch.done.is_set():
                break
            fetch, self._fetch = self._fetch, None
            self._finish(fetch)
        for version in [v for v in self._candidates if v <= self.loaded]:
            del self._candidates[version]

    def _start_due(self) -> Fetch | None:
        now = time.monotonic()
        for version in sorted(self._candidates, reverse=True):
            candidate = self._candidates[version]
            if version > self.loaded and candidate.due(now):
                return Fetch(candidate.update, self._shapes).start()
        return None

    def _finish(self, fetch: Fetch) -> None:
        """Swap in what `fetch` read, or count its failure against its candidate. A candidate dropped or
        announced again with another checkpoint while it was read is left to what replaced it."""
        update = fetch.update
        # Taken off the fetch, so that they are let go once swapped in (or left), not held while the
        # loop reads the next version: two copies of the model besides the backend's.
        state, fetch.state = fetch.state, None
        candidate = self._candidates.get(update.version)
        if (
            candidate is None
            or not same_checkpoint(candidate.update, update)
            or update.version <= self.loaded
        ):
            return
        try:
            if state is None:  # what the read raised; anything not tolerated ends the loop as before
                raise fetch.error or RuntimeError(f"the load of v{update.version} ended without weights")
            self._backend.load_weights(state, update.version, owned=True)  # verified, ours alone
        except _TOLERATED as exc:
            self._failed(candidate, failure_reason(exc), exc)
            return
        seconds = time.perf_counter() - fetch.started
        self._metrics.weight_load_seconds.observe(seconds)
        self._metrics.policy_version.set(update.version)
        log.info("loaded policy v%d from %s in %.2fs", update.version, update.manifest_uri, seconds)

    def _failed(self, candidate: Candidate, reason: str, exc: Exception) -> None:
        """Schedule a retry of a transient failure, or reject the version (counted, not retried)."""
        update = candidate.update
        now = time.monotonic()
        if is_transient(reason):
            previous = candidate.retry or Retry(update.version, 0, now, now)
            following = previous.after_failure(self._reload, now)
            if following is not None:
                candidate.retry = following
                self._metrics.weight_load_retries.labels(reason).inc()
                log.warning(
                    "policy v%d not loadable yet (%s, attempt %d; retrying in %.1fs): %s",
                    update.version,
                    reason,
                    following.attempts,
                    following.next_at - now,
                    str(exc),
                )
                return
            reason_text = f"{reason} for {now - previous.since:.0f}s, gave up"
        else:
            reason_text = reason
        self._candidates.pop(update.version, None)
        self._metrics.weight_load_failures.labels(reason).inc()
        log.error(
            "rejected policy v%d (%s): %s; keeping v%d", update.version, reason_text, str(exc), self.loaded
        )

    def _track_behind(self) -> None:
        """Readiness while no announced version waits to be loaded or rejected and no held work waits
        for an announced version that did not load; a liveness deadline while either does."""
        stuck = self._wanted is not None and self.loaded < self._wanted <= self.announced
        behind = bool(self._candidates) or stuck
        self._health.set(WEIGHTS_OK, not behind)
        if behind != self._behind:
            self._health.fail_after(WEIGHTS_CURRENT, self._reload.max_behind_s if behind else None)
            self._behind = behind
