"""In-memory transport for unit tests of service cores: one partition per topic, committed offsets
per consumer group, the same `Publisher` / `ConsumerClient` interfaces as the Kafka implementation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from sapo.kafka.chunks import chunk_size, split
from sapo.kafka.records import AssignHook, Header, OffsetPosition, Record, RevokeHook, TopicPartition
from sapo.topics import DEFAULT_MAX_MESSAGE_BYTES


class MemoryBus:
    """Topics as append-only lists, and each group's committed positions."""

    def __init__(self) -> None:
        self.topics: dict[str, list[Record]] = {}
        self.committed: dict[tuple[str, TopicPartition], int] = {}
        self._lock = threading.Lock()

    def append(
        self, topic: str, key: bytes | None, value: bytes, headers: Sequence[Header]
    ) -> tuple[int, int]:
        with self._lock:
            log = self.topics.setdefault(topic, [])
            log.append(Record(topic, 0, len(log), key, value, dict(headers)))
            return 0, len(log) - 1

    def values(self, topic: str) -> list[bytes]:
        return [r.value or b"" for r in self.topics.get(topic, [])]


class MemoryPublisher:
    def __init__(self, bus: MemoryBus, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._bus = bus
        self._chunk_bytes = chunk_size(max_message_bytes)

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
        self.send_sync(topic, key, value, headers)

    def partitions(self, topic: str) -> int:
        return 1

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
        acks = [
            self._bus.append(topic, key, piece, h) for piece, h in split(value, headers, self._chunk_bytes)
        ]
        return acks[-1]

    def flush(self, timeout_s: float) -> int:
        return 0


class MemoryConsumerClient:
    """Round-robins over its topics' single partitions starting from the group's committed positions."""

    def __init__(self, bus: MemoryBus, group_id: str) -> None:
        self._bus = bus
        self.group_id = group_id
        self._positions: dict[TopicPartition, int] = {}
        self._stored: dict[TopicPartition, int] = {}

    def subscribe(
        self, topics: Sequence[str], on_assign: AssignHook, on_revoke: RevokeHook, on_lost: RevokeHook
    ) -> None:
        tps = [(t, 0) for t in topics]
        starts = on_assign(tps)
        for tp in tps:
            self._positions[tp] = starts.get(tp, self._bus.committed.get((self.group_id, tp), 0))

    def poll(self, timeout: float) -> Record | None:
        for tp, pos in self._positions.items():
            log = self._bus.topics.get(tp[0], [])
            if pos < len(log):
                self._positions[tp] = pos + 1
                return log[pos]
        return None

    def store(self, positions: Sequence[OffsetPosition]) -> None:
        for topic, partition, offset in positions:
            self._stored[(topic, partition)] = offset

    def commit(self) -> None:
        for tp, offset in self._stored.items():
            self._bus.committed[(self.group_id, tp)] = offset

    def offset_bounds(
        self, tps: Sequence[TopicPartition], timeout_s: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        known = [tp for tp in tps if tp[0] in self._bus.topics and tp[1] == 0]
        return {tp: (0, len(self._bus.topics[tp[0]])) for tp in known}

    def close(self, wait_s: float | None = None) -> None:
        self.commit()
