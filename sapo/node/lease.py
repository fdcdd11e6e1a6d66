"""One writer per node role: the lease that fences a second sampler or trainer before it writes.

A node's sampler owns its batch sequence and its trainer owns the checkpoint store and the policy
versions: a second copy of either (`kubectl scale`, a rolling update's overlap, a partitioned node that
comes back) would fork them. Each of the two holds a lease on `<prefix>.node.<id>.leases` (compacted,
one partition, key = role) before it writes anything:

- Acquire: read the topic to its end (until idle: the embedded broker's high watermark is wrong). If the
  latest record of the role is another owner's and still live (renewed within its `ttl_s`, not
  released), wait as a standby: log it, export `sapo_<service>_lease_held 0` and write nothing. A
  standby is ready (`LEASE_READ`), as a leader-elected Kubernetes controller's standby is: it is doing
  its job, and a Deployment with a standby that never turned ready would never finish a rollout
  (`kubectl rollout status`, `helm --wait`). `lease_held` says which copy is active. Otherwise write an
  acquisition record; its offset in the single partition (+ 1) is the lease's *epoch*, unique and
  increasing. Read on for a grace period: if another acquisition with a higher epoch shows up, the later
  one won and this process stands by.
- Hold: renew every `ttl_s / 3`, and call `check()` before every write. It reads the topic without
  waiting; a record of the role with a higher epoch means another process took over (this one
  was paused or partitioned past its lease): `FencedError` is raised, counted
  (`sapo_<service>_fenced_total`) and the process exits before writing. A holder whose last
  acknowledged renewal is older than 80% of `ttl_s` cannot know it still holds the lease, so it stops
  too (`LeaseLostError`). A holder that stops cleanly writes a release record, so a standby takes over at
  once instead of after `ttl_s`.
- Epochs on the writes: batches (`TrainingBatch.epoch`), policy updates and work items carry the
  writer's epoch, and their readers refuse one from an epoch lower than the highest they have seen. That
  closes the last gap, a paused holder that wakes and writes once before its next `check()`.

What is read is bounded, so that one record from any client that can write to the node's topics cannot
take a role for good (a lease nobody can outbid or outwait) or make every later write look fenced.
Each refused record is counted, dead-lettered and skipped (`InvalidMessageError`, by reason), and
dead-lettered once: by the processes that read it as it arrived, not again by every later start, which
reads the whole topic (the loop's `history` reading, `sapo.kafka.consumer`):

- `lease_ttl_out_of_range`: a `ttl_s` that is not finite or not within 0..`MAX_LEASE_TTL_S` (the
  longest `lease_ttl_s` a process may be set to), so a lease no longer renewed expires within an hour.
- `lease_epoch_ahead`: an epoch above the record's own offset. An epoch is the offset + 1 of an
  earlier acquisition on this single partition, so a legitimate renewal or release never carries one;
  every later acquisition outbids any epoch that is let through. A holder whose own record is refused
  so (the topic was deleted and created again under it) has lost its lease and stops.
- `lease_renewed_ahead`: a `renewed_at` more than `MAX_CLOCK_AHEAD_S` ahead of this process's clock,
  which would keep the lease live for that long beyond its ttl. Clocks of one cluster agree within
  far less; a holder whose clock is that far ahead loses its lease to a standby (it is fenced) rather
  than keep one nobody could take over. Its epoch still counts (never as live): such a process sees a
  live holder as expired and acquires, and the holder it outbid must stop, or both would write.
- A trainer refuses a batch whose sampler epoch lies beyond the end of the leases topic as read
  (`epoch_beyond_leases`; `vouches`): no acquisition has given it, and letting it through would make
  every later batch look fenced. The sampler's acquisition precedes its first batch, so the trainer
  reads the topic on (until it has been idle for `lease_read_idle_s`) before refusing one.

The embedded broker honours all of this (single-partition produce order, offsets, reads from the
start); it does not compact, so the topic keeps every renewal (one record per role every `ttl_s / 3`:
about 1 MB a day). Apache Kafka compacts it to the latest record per role. Transactional producers'
zombie fencing (`transactional.id`) would add broker-side fencing on Apache Kafka; the embedded broker
accepts transactions without honouring them, so the lease does not rely on them.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import CollectorRegistry, Counter, Gauge

from sapo.kafka import (
    ConsumerClient,
    ConsumerLoop,
    DeadLetters,
    Disposition,
    Publisher,
    Record,
    TransportError,
    TransportMetrics,
)
from sapo.kafka.errors import ProduceError, ServiceError
from sapo.lifecycle import StopFlag
from sapo.ops import Health
from sapo.runtime import Runtime
from sapo.settings import MAX_LEASE_TTL_S, LeaseSettings
from sapo.v1 import lease_pb2
from sapo.wire import DECODE_REASONS, SCHEMA_VERSION, InvalidMessageError, decode, message_headers

log = logging.getLogger(__name__)

LEASE_READ: Final = "lease"
"""The readiness condition of a service that writes only while it holds its lease: the leases topic
was read and this process holds the lease or stands by behind a live holder."""
CHECK_EVERY_S: Final = 0.5
"""How often the service loop's `check` reads the leases topic (every write reads it anyway)."""
STALE_FRACTION: Final = 0.8
"""A holder stops writing once its last acknowledged renewal is this much of the ttl old."""
ASSIGN_TIMEOUT_S: Final = 120.0
"""Longest wait for the leases topic's partition: a missing topic fails the start with what to do."""
MAX_CLOCK_AHEAD_S: Final = 300.0
"""A lease record renewed further than this ahead of the reader's clock is refused (Kerberos allows
clocks as far apart by default)."""
RENEWED_AHEAD: Final = "lease_renewed_ahead"
LEASE_REASONS: Final = (
    *DECODE_REASONS,
    "wrong_node",
    "lease_ttl_out_of_range",
    "lease_epoch_ahead",
    RENEWED_AHEAD,
)
"""Every reason a lease reader refuses a record of the leases topic for."""
_MAX_DRAIN: Final = 10_000


class FencedError(ServiceError):
    """Another process of the same role holds a newer lease: this one must not write."""


class LeaseLostError(ServiceError):
    """This process could not renew its lease in time: it cannot know it still holds it."""


@dataclass(frozen=True)
class Holder:
    """The latest state of one role's lease as read from the topic."""

    owner: str
    epoch: int
    renewed_s: float
    ttl_s: float
    released: bool

    def live(self, now_s: float) -> bool:
        return not self.released and now_s - self.renewed_s < self.ttl_s


def fold(
    current: Holder | None, lease: lease_pb2.Lease, offset: int, *, clock_trusted: bool = True
) -> Holder | None:
    """The role's lease after one more record: the highest epoch wins; an acquisition's epoch is its
    own offset + 1 (0 stays "none"); a record of a lower epoch (a fenced holder still renewing)
    changes nothing. A record whose clock is not trusted counts for its epoch but is never live."""
    epoch = lease.epoch or offset + 1
    if current is not None and epoch < current.epoch:
        return current
    renewed = lease.renewed_at.seconds + lease.renewed_at.nanos / 1e9 if clock_trusted else -math.inf
    return Holder(lease.owner, epoch, renewed, lease.ttl_s, lease.released)


def lease_problem(lease: lease_pb2.Lease, offset: int, now_s: float) -> InvalidMessageError | None:
    """Why a lease record read at `offset` at `now_s` cannot be trusted (see the module docstring), or
    None."""
    ttl_s = lease.ttl_s
    if not (math.isfinite(ttl_s) and 0.0 <= ttl_s <= MAX_LEASE_TTL_S):
        return InvalidMessageError(
            "lease_ttl_out_of_range", f"ttl_s {ttl_s} of {lease.owner!r} is not within 0..{MAX_LEASE_TTL_S} s"
        )
    if lease.epoch > offset:
        return InvalidMessageError(
            "lease_epoch_ahead",
            f"epoch {lease.epoch} of {lease.owner!r} at offset {offset}: no acquisition before it has it",
        )
    ahead_s = lease.renewed_at.seconds + lease.renewed_at.nanos / 1e9 - now_s
    if ahead_s > MAX_CLOCK_AHEAD_S:
        return InvalidMessageError(
            RENEWED_AHEAD,
            f"renewed_at of {lease.owner!r} is {ahead_s:.0f} s ahead of this clock (at most "
            f"{MAX_CLOCK_AHEAD_S:.0f} s)",
        )
    return None


class LeaseMetrics:
    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        p = f"sapo_{service}"
        self.held = Gauge(
            f"{p}_lease_held", "1 while this process holds its role's lease.", registry=registry
        )
        self.epoch = Gauge(f"{p}_lease_epoch", "Epoch of the lease this process holds.", registry=registry)
        self.fenced = Counter(
            f"{p}_fenced_total",
            "Times this process found another process of its role holding a newer lease, or lost its "
            "own, and stopped writing.",
            registry=registry,
        )


def owner_id() -> str:
    """Who asks for a lease: the host (the pod's name on Kubernetes), the pid and a random suffix."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class Lease:
    """One process's lease on its node role; see the module docstring."""

    def __init__(
        self,
        client: ConsumerClient,
        publisher: Publisher,
        *,
        topic: str,
        node_id: str,
        role: str,
        ttl_s: float,
        idle_s: float,
        metrics: LeaseMetrics,
        transport: TransportMetrics,
        health: Health,
        stop: StopFlag,
        dead_letters: DeadLetters | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._publisher = publisher
        self._topic = topic
        self._node_id = node_id
        self._role = role
        self._ttl_s = ttl_s
        self._idle_s = idle_s
        self._metrics = metrics
        self._health = health
        self._stop = stop
        self._clock = clock
        self.owner = owner_id()
        self.epoch = 0
        """The epoch this process holds; 0 while it holds none."""
        self.holder: Holder | None = None
        self.end = 0
        """The offset + 1 of the last record read: no epoch of this topic is higher."""
        self._renewed_s = 0.0
        self._checked_s = 0.0
        self._newest_ms = 0
        """Write time of the newest record read (the producer's clock), to know the end was reached."""
        self._loop = ConsumerLoop(
            client,
            [topic],
            self._read,
            stop=stop,
            metrics=transport,
            dead_letters=dead_letters,
            stream_of=lambda _topic: "leases",
            history=True,
            poll_timeout_s=0.0,
        )
        health.require(LEASE_READ)

    def acquire(self) -> bool:
        """Block until this process holds the lease (True), or the stop flag is set (False)."""
        self._loop.open()
        warned = False
        while not self._stop.is_set():
            self._read_until_idle()
            now = self._clock()
            holder = self.holder
            if holder is not None and holder.owner != self.owner and holder.live(now):
                if not warned:
                    log.warning(
                        "standby: another %s of node %s holds the lease (owner %s, epoch %d, renewed %.0f s "
                        "ago); this one writes nothing until it expires",
                        self._role,
                        self._node_id,
                        holder.owner,
                        holder.epoch,
                        now - holder.renewed_s,
                    )
                    warned = True
                self._metrics.held.set(0)
                self._health.set(LEASE_READ, True)
                self._stop.wait(min(1.0, self._ttl_s / 3))
                continue
            try:
                self._write(epoch=0)
            except ProduceError as exc:  # the broker is away (restarting, say): ask again when it is back
                if self._stop.is_set():
                    break
                log.warning("asking for the %s lease was not acknowledged (%s); again", self._role, exc)
                self._stop.wait(min(1.0, self._ttl_s / 3))
                continue
            self._read_until_idle()
            if self.holder is not None and self.holder.owner == self.owner:
                self.epoch = self.holder.epoch
                self._metrics.held.set(1)
                self._metrics.epoch.set(self.epoch)
                self._health.set(LEASE_READ, True)
                log.info(
                    "holding the %s lease of node %s with epoch %d", self._role, self._node_id, self.epoch
                )
                return True
        return False

    def check(self, *, before_write: bool = False) -> None:
        """Raise `FencedError` or `LeaseLostError` unless this process still holds the lease; renew it
        when a third of its ttl has passed. Called before every write (`before_write`: always reads the
        topic) and from the service loop (reads it at most every `CHECK_EVERY_S`)."""
        now = self._clock()
        if not before_write and now - self._checked_s < CHECK_EVERY_S:
            return
        self._checked_s = now
        self._drain()
        holder = self.holder
        if holder is not None and holder.epoch > self.epoch and holder.owner != self.owner:
            self._lose(
                FencedError(
                    f"another {self._role} of node {self._node_id} took over (owner {holder.owner}, epoch "
                    f"{holder.epoch} > {self.epoch}): this one stops without writing"
                )
            )
        if now - self._renewed_s >= self._ttl_s / 3:
            self._renew()
        if now - self._renewed_s > STALE_FRACTION * self._ttl_s:
            self._lose(
                LeaseLostError(
                    f"the {self._role} lease of node {self._node_id} was last renewed "
                    f"{now - self._renewed_s:.0f} s ago (ttl {self._ttl_s} s): stopping without writing"
                )
            )

    def vouches(self, epoch: int) -> bool:
        """Whether a write of `epoch` may come from a holder of a lease of this topic: no acquisition
        lies beyond the topic's end. An epoch beyond the end read so far is read for until nothing
        arrives for `idle_s`: a holder writes its acquisition before anything else, but this reader
        may not have fetched it yet. False too when a stop cut that read short: that says nothing of
        the write."""
        idle_since = time.monotonic()
        while epoch > self.end and not self._stop.is_set():
            self._health.beat()
            if self._loop.step(0.1):
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= self._idle_s:
                break
        return epoch <= self.end

    def release(self) -> None:
        """Give the lease up (clean stop): a standby may take it at once. Best effort."""
        if self.epoch:
            try:
                self._write(epoch=self.epoch, released=True)
            except Exception:
                log.warning(
                    "could not release the %s lease; a standby takes over after %s s",
                    self._role,
                    self._ttl_s,
                    exc_info=True,
                )
            self.epoch = 0
            self._metrics.held.set(0)
        self._loop.close()

    def _renew(self) -> None:
        try:
            self._write(epoch=self.epoch)
        except Exception:
            log.warning("renewing the %s lease failed", self._role, exc_info=True)

    def _lose(self, error: FencedError | LeaseLostError) -> None:
        self._metrics.fenced.inc()
        self._metrics.held.set(0)
        self._health.set(LEASE_READ, False)
        self.epoch = 0
        log.error("%s", error)
        raise error

    def _write(self, *, epoch: int, released: bool = False) -> None:
        sent_s = self._clock()
        renewed_at = Timestamp()
        renewed_at.FromNanoseconds(int(sent_s * 1e9))
        lease = lease_pb2.Lease(
            schema_version=SCHEMA_VERSION,
            node_id=self._node_id,
            role=self._role,
            owner=self.owner,
            epoch=epoch,
            renewed_at=renewed_at,
            ttl_s=self._ttl_s,
            released=released,
        )
        value = lease.SerializeToString()
        headers = message_headers("Lease", self._node_id, value)
        # A stop ends the wait for an acquisition (the broker may be out of reach: a process that holds
        # nothing should not sit out ttl / 3), never for a renewal or the release: a holder that was
        # asked to stop still renews while it writes its final state, then releases.
        cancel = self._stop.is_set if epoch == 0 and not released else None
        self._publisher.send_sync(
            self._topic, self._role.encode(), value, headers, timeout_s=self._ttl_s / 3, cancel=cancel
        )
        self._renewed_s = sent_s

    def _read(self, record: Record) -> Disposition:
        now = self._clock()
        self.end = max(self.end, record.offset + 1)
        if record.timestamp_ms <= (now + MAX_CLOCK_AHEAD_S) * 1000:  # a record from the future ends no read
            self._newest_ms = max(self._newest_ms, record.timestamp_ms)
        lease = decode(lease_pb2.Lease, record.value, 1 << 16)
        if lease.node_id != self._node_id or not lease.owner:
            raise InvalidMessageError("wrong_node", f"lease of {lease.node_id!r} on {self._node_id}'s topic")
        problem = lease_problem(lease, record.offset, now)
        if problem is not None:
            if self.epoch and lease.owner == self.owner and problem.reason == "lease_epoch_ahead":
                self._lose(
                    LeaseLostError(
                        f"the leases topic {self._topic} no longer holds the acquisition of epoch "
                        f"{self.epoch} (created again?): this {self._role} stops without writing"
                    )
                )
            if problem.reason == RENEWED_AHEAD and lease.role == self._role:
                # Its epoch still fences: a process whose clock runs ahead sees a live holder as
                # expired and takes the lease, and the holder must stop, or both write.
                self.holder = fold(self.holder, lease, record.offset, clock_trusted=False)
            raise problem
        if lease.role == self._role:
            self.holder = fold(self.holder, lease, record.offset)
        return Disposition.DONE

    def _drain(self) -> None:
        for _ in range(_MAX_DRAIN):
            if not self._loop.step(0.0):
                return

    def _read_until_idle(self) -> None:
        """Read to the topic's end: until a record written after this read began (a live holder renews
        every ttl / 3), or nothing arrived for `idle_s` after the partition was assigned (no holder)."""
        idle_since = started = time.monotonic()
        began_ms: int | None = None  # when the partition was assigned: fetching from there on
        while not self._stop.is_set():
            self._health.beat()
            if began_ms is None and self._loop.assigned:
                began_ms = int(self._clock() * 1000)
            if began_ms is not None and self._newest_ms >= began_ms:
                return
            if self._loop.step(0.1) or not self._loop.assigned:
                idle_since = time.monotonic()
                if not self._loop.assigned and idle_since - started > ASSIGN_TIMEOUT_S:
                    raise TransportError(
                        f"the leases topic {self._topic} was not assigned within {ASSIGN_TIMEOUT_S} s: "
                        "create the node's topics (`sapo topics`, or the chart's kafkaTopics)"
                    )
            elif time.monotonic() - idle_since >= self._idle_s:
                return


def node_lease(runtime: Runtime, settings: LeaseSettings, role: str) -> Lease:
    """The lease of this process's role on its node, wired to the process runtime."""
    return Lease(
        runtime.consumer(f"{role}-lease", per_process=True, watch=True),
        runtime.publisher,
        topic=runtime.topics.leases,
        node_id=runtime.settings.node_id,
        role=role,
        ttl_s=settings.lease_ttl_s,
        idle_s=settings.lease_read_idle_s,
        metrics=LeaseMetrics(runtime.registry, role),
        transport=runtime.transport,
        health=runtime.health,
        stop=runtime.stop,
        dead_letters=runtime.dead_letters,
    )
