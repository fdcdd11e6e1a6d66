"""Transport-neutral records, the consumer-client interface, and per-partition offset watermarks."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

TopicPartition = tuple[str, int]
# (topic, partition, next offset to read): what a consumer group commits.
OffsetPosition = tuple[str, int, int]
Header = tuple[str, bytes]


@dataclass(frozen=True)
class Record:
    """One consumed message, decoupled from the client library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0
    parts: tuple[Record, ...] = ()
    """The chunk records a reassembled message was made of (`sapo.kafka.chunks`); empty otherwise."""
    unreadable: str = ""
    """Why the client could not read the record's headers (a header name that is not UTF-8), which
    are then empty; the consumer loop refuses such a record (`bad_header`) without handling it."""

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def offsets(self) -> tuple[Record, ...]:
        """The records whose offsets this message covers: its chunks, or itself."""
        return self.parts or (self,)


AssignHook = Callable[[list[TopicPartition]], dict[TopicPartition, int]]
RevokeHook = Callable[[list[TopicPartition]], None]


class ConsumerClient(Protocol):
    """What the consumer loop needs from a client: Kafka in production, memory in unit tests."""

    def subscribe(
        self, topics: Sequence[str], on_assign: AssignHook, on_revoke: RevokeHook, on_lost: RevokeHook
    ) -> None:
        """Join the group; on_assign returns explicit start offsets for some partitions (may be empty)."""

    def poll(self, timeout: float) -> Record | None:
        """The next record, or None when none arrived within timeout."""

    def store(self, positions: Sequence[OffsetPosition]) -> None:
        """Mark positions as safe to commit (committed by the client's periodic commit or commit())."""

    def commit(self) -> None:
        """Synchronously commit stored positions."""

    def offset_bounds(
        self, tps: Sequence[TopicPartition], timeout_s: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(first, end) offset of each partition as the broker answers now, end being the offset the
        next message will get; partitions the broker does not know are left out."""

    def close(self, wait_s: float | None = None) -> None:
        """Leave the group and release resources (stored positions are committed first). With `wait_s`,
        return after at most that long, leaving a close that takes longer to finish on its own (its
        commit may be lost: the records are re-delivered)."""


class Publisher(Protocol):
    """What services need from a producer."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        *,
        best_effort: bool = False,
    ) -> None:
        """Queue a message (to `partition`, or the key's; in chunks when larger than one message may
        be: `sapo.kafka.chunks`); delivery failures surface through the producer's error accounting
        and the next `flush`, except a `best_effort` one's (a dead letter), which is counted only."""

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (from the cluster's metadata)."""

    def send_sync(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[Header] = (),
        timeout_s: float = 30.0,
        *,
        cancel: Callable[[], bool] | None = None,
    ) -> tuple[int, int]:
        """Send and wait for the broker's acknowledgement; returns (partition, offset). A wait that
        `cancel()` ends (a stop asked for) raises `DeliveryError` like one that timed out."""

    def flush(self, timeout_s: float) -> int:
        """Wait for queued messages; returns how many sent since the last flush are not delivered (still
        queued, or failed)."""


class Watermarks:
    """Tracks offsets that are read but not yet finished, per partition.

    The committable position of a partition is its lowest unfinished offset, or one past the highest
    offset seen when all are finished. Committing that position and no further is what makes
    at-least-once hold when records finish out of order (a sampler holds groups in its pool while
    later ones are already in an emitted batch).

    The lowest unfinished offset comes from a heap per partition whose finished offsets leave lazily
    (when they reach the top, or all at once when they outnumber the unfinished ones): a sampler holds
    thousands of records in its pool, so a `min` over the unfinished set cost ~60 us per record read.
    Finishing any but the lowest unfinished offset leaves the position where it was, so only a finish
    that moved one marks the positions for storing; the unfinished count is kept, not summed. The
    loop asks after every record (and stores at most every `STORE_INTERVAL_S`), and most of a
    sampler's records finish above a held one.
    """

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, set[int]] = {}
        self._lowest: dict[TopicPartition, list[int]] = {}
        """Per partition a heap of offsets whose top, while any is unfinished, is the lowest of them."""
        self._next: dict[TopicPartition, int] = {}
        self._count = 0
        self._dirty = False

    def seen(self, tp: TopicPartition, offset: int) -> None:
        pending = self._pending.setdefault(tp, set())
        if offset not in pending:
            pending.add(offset)
            self._count += 1
            heapq.heappush(self._lowest.setdefault(tp, []), offset)  # offsets come in order: O(1)
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def finish(self, tp: TopicPartition, offset: int) -> None:
        pending = self._pending.get(tp)
        if pending is None or offset not in pending:
            return
        pending.discard(offset)
        self._count -= 1
        heap = self._lowest[tp]
        if not pending:
            heap.clear()
            self._dirty = True
            return
        if len(heap) > 2 * len(pending) + 64:  # mostly finished offsets behind a long-held one
            heap[:] = sorted(pending)  # a sorted list is a heap
        while heap[0] not in pending:
            heapq.heappop(heap)
        if offset < heap[0]:  # it was the lowest unfinished one: the position moved
            self._dirty = True

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget partitions that were revoked or lost; their next owner re-reads from the commit."""
        for tp in tps:
            self._count -= len(self._pending.pop(tp, ()))
            self._lowest.pop(tp, None)
            self._next.pop(tp, None)

    def pending_count(self) -> int:
        return self._count

    def positions(self) -> list[OffsetPosition]:
        return [
            (tp[0], tp[1], self._lowest[tp][0] if pending else self._next[tp])
            for tp, pending in self._pending.items()
            if tp in self._next
        ]

    def take_dirty(self) -> bool:
        """True once after a finish() that moved a position; lets the loop store positions only then."""
        dirty, self._dirty = self._dirty, False
        return dirty
