"""Kafka producer the standard confluent-kafka way.

Delivery callback per message, `poll(0)` after each send to serve callbacks, a full local queue
(`BufferError`) treated as backpressure (serve callbacks, retry, give up after a bound), and a
bounded flush on close; once the service's stop flag is set, every wait for an acknowledgement is
bounded by it (`sapo.lifecycle.StopFlag.deadline`), counted from the latest acknowledgement: a
broker that keeps acknowledging is slow, not gone, and its wait keeps its own timeout. Idempotence
and acks=all keep retries from duplicating or losing messages.
Payloads larger than one message may be (`max_message_bytes`, the broker's limit) go out in chunks
(`sapo.kafka.chunks`), zstd-compressed like everything else: nothing has to raise a broker limit.

Errors by kind (`error_kind`, a bounded metric label): `too_large` (a message, headers included, over
the limit: refused by librdkafka or the broker), `queue_full` (backpressure beyond the bound),
`timeout` (no acknowledgement within message.timeout.ms), `fatal` (the idempotent producer is
unusable: the service must stop and be restarted), `retriable` and `refused` (anything else the
broker or client turned down). A refused produce raises `ProduceError` with its kind; a failed
delivery is counted by kind in `sapo_<service>_produce_errors_total{kind}`, logged, and (for `send`)
reported by the next `flush` as not delivered (unless sent `best_effort`). Callers decide what a
failure means: a dead letter that cannot be written is counted and dropped (`sapo.kafka.dlq` sends
best effort, so a broken dead-letter topic never stops a service), a batch or policy update the
broker did not take stops the service, and so do groups or work items a flush reports not delivered.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka import Producer as _Producer

from sapo.clientlog import client_hooks
from sapo.kafka.chunks import chunk_size, split
from sapo.kafka.errors import BackpressureTimeoutError, DeliveryError, ProduceError, error_kind
from sapo.kafka.metrics import TransportMetrics
from sapo.kafka.records import Header
from sapo.lifecycle import StopFlag
from sapo.topics import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS = {
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "5",
    "message.timeout.ms": "60000",
    # Rollout text, token ids and log-probs compress 2-4x; the broker stores batches compressed.
    "compression.type": "zstd",
}

FLUSH_SLICE_S = 0.1
"""How long `flush` waits between looks at the stop flag's bound: as long as a stop may overrun it."""


@dataclass
class _Sent:
    """The delivery reports of one message `send` queued, in however many chunks."""

    queued: int = 0
    reported: int = 0
    failed: bool = False
    whole: bool = False
    """Every chunk is queued (or one was refused): no more reports to wait for than `queued`."""


class KafkaPublisher:
    """A `Publisher` over librdkafka."""

    def __init__(
        self,
        config: dict[str, str],
        metrics: TransportMetrics | None = None,
        queue_full_timeout_s: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        setting: str = "bootstrap.servers",
        *,
        stop: StopFlag | None = None,
    ) -> None:
        """`setting` names where `bootstrap.servers` came from, for the error an unreachable cluster
        logs (`sapo.clientlog`). `stop`: the service's, which bounds `send_sync`'s and `flush`'s waits
        once it is set (`StopFlag.deadline`)."""
        limits = {"message.max.bytes": str(max_message_bytes)}
        self._producer = _Producer(PRODUCER_DEFAULTS | limits | config | client_hooks(config, setting))
        self._chunk_bytes = chunk_size(max_message_bytes)
        self._metrics = metrics
        self._queue_full_timeout_s = queue_full_timeout_s
        self._stop = stop
        self.errors = 0
        self._acknowledged = 0
        """Chunks the broker acknowledged: while they keep coming, a stop's bound does not run out."""
        self._failed = 0
        """Messages `send` queued whose delivery failed since the last `flush`, which reports them."""
        self._unacked = 0
        """Messages `send` queued (not best effort) with a chunk not reported yet: a dead letter or a
        `send_sync` message still in librdkafka's queue is no undelivered message of `flush`'s. A
        message sent in chunks counts once, as `flush` reports messages."""

    def _report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors += 1
            kind = error_kind(err)
            if self._metrics:
                self._metrics.produce_errors.labels(kind).inc()
            log.error("delivery to %s failed (%s): %s", msg.topic(), kind, err)
            return
        self._acknowledged += 1
        if self._metrics:
            self._metrics.produced.inc()

    def _on_delivery(self, sent: _Sent, err: KafkaError | None, msg: Message) -> None:
        self._report(err, msg)
        sent.reported += 1
        sent.failed = sent.failed or err is not None
        self._settle(sent)

    def _settle(self, sent: _Sent) -> None:
        """Count a message `send` queued as acknowledged (or failed) once its last chunk is reported."""
        if sent.whole and sent.queued and sent.reported == sent.queued:
            self._unacked -= 1
            self._failed += sent.failed
            sent.queued = 0  # settled: never counted again

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[Header],
        cb: Any,
        *,
        partition: int | None = None,
    ) -> None:
        deadline = time.monotonic() + self._queue_full_timeout_s
        # -1 = unassigned: the configured partitioner picks one from the key.
        target = -1 if partition is None else partition
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, partition=target, headers=list(headers), on_delivery=cb
                )
                break
            except BufferError:
                if time.monotonic() > deadline:
                    self._count("queue_full")
                    raise BackpressureTimeoutError(
                        f"producer queue full for {self._queue_full_timeout_s}s sending to {topic}"
                    ) from None
                self._producer.poll(0.1)
            except KafkaException as exc:  # refused before queueing: too large, unknown topic, fatal
                err: KafkaError = exc.args[0]
                kind = error_kind(err)
                self._count(kind)
                raise ProduceError(kind, f"cannot send {len(value)} bytes to {topic}: {err.str()}") from None
        self._producer.poll(0)

    def _count(self, kind: str) -> None:
        self.errors += 1
        if self._metrics:
            self._metrics.produce_errors.labels(kind).inc()

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
        pieces = split(value, headers, self._chunk_bytes)
        if best_effort:
            for piece, piece_headers in pieces:
                self._produce(topic, key, piece, piece_headers, self._report, partition=partition)
            return
        sent = _Sent()
        report = functools.partial(self._on_delivery, sent)
        try:
            for piece, piece_headers in pieces:
                self._produce(topic, key, piece, piece_headers, report, partition=partition)
                sent.queued += 1
                if sent.queued == 1:
                    self._unacked += 1
        finally:  # a refused chunk ends the message where it is: what was queued is still reported
            sent.whole = True
            self._settle(sent)

    def partitions(self, topic: str, timeout_s: float = 10.0) -> int:
        metadata = self._producer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            problem = metadata.error if metadata is not None else "not in the metadata"
            raise DeliveryError(f"topic {topic} has no partitions to send to: {problem}", "refused")
        return len(metadata.partitions)

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
        """Send and wait for every chunk's acknowledgement; (partition, offset) of the last one. The
        wait ends early, raising `DeliveryError`, once `cancel()` holds."""
        pieces = split(value, headers, self._chunk_bytes)
        result: list[tuple[KafkaError | None, Message]] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            self._report(err, msg)  # a failure raises here, not in a later flush
            result.append((err, msg))

        for piece, piece_headers in pieces:
            self._produce(topic, key, piece, piece_headers, on_delivery)
        start = answered = time.monotonic()
        acknowledged = self._acknowledged
        while len(result) < len(pieces) and time.monotonic() < self._deadline(start, timeout_s, answered):
            if cancel is not None and cancel():
                raise DeliveryError(f"stopped waiting for the acknowledgement from {topic}")
            self._producer.poll(0.05)
            if self._acknowledged != acknowledged:
                acknowledged, answered = self._acknowledged, time.monotonic()
        if len(result) < len(pieces):
            waited = min(timeout_s, time.monotonic() - start)  # less where a stop cut the wait short
            self._unanswered()
            raise DeliveryError(f"no acknowledgement from {topic} within {waited:.1f}s")
        failed = [err for err, _ in result if err is not None]
        if failed:
            raise DeliveryError(f"delivery to {topic} failed: {failed[0]}", error_kind(failed[0]))
        _, msg = result[-1]
        return int(msg.partition() or 0), int(msg.offset() or 0)

    def poll(self, timeout_s: float = 0.0) -> None:
        self._producer.poll(timeout_s)

    def _deadline(self, start: float, timeout_s: float, answered: float) -> float:
        """`timeout_s` after `start`; while stopping, no later than the stop's bound after `answered`,
        the latest acknowledgement (or `start`): a broker that keeps acknowledging is slow, not gone
        (a big final flush, a batch of many chunks), and what it takes is not left to be redone."""
        end = start + timeout_s
        return end if self._stop is None else min(end, self._stop.deadline(answered, timeout_s))

    def _unanswered(self) -> None:
        if self._stop is not None:
            self._stop.broker_unanswered()

    def flush(self, timeout_s: float) -> int:
        """Wait for queued messages; returns how many messages `send` queued since the last flush were
        not delivered: still queued, or failed (refused by the broker, timed out before the wait ended).
        The wait goes in short slices, so that a stop that comes meanwhile bounds it too."""
        start = answered = time.monotonic()
        acknowledged = self._acknowledged
        remaining = len(self._producer)
        while remaining:
            left = self._deadline(start, timeout_s, answered) - time.monotonic()
            if left <= 0:
                break
            remaining = int(self._producer.flush(min(left, FLUSH_SLICE_S)))
            if self._acknowledged != acknowledged:
                acknowledged, answered = self._acknowledged, time.monotonic()
        self._producer.poll(0)  # the reports of what was delivered before a wait of no time at all
        failed, self._failed = self._failed, 0
        if remaining:
            self._unanswered()
            log.warning(
                "%d Kafka records (chunks count one each) still queued after %.1fs flush",
                remaining,
                min(timeout_s, time.monotonic() - start),
            )
        return self._unacked + failed

    def close(self, timeout_s: float = 10.0) -> int:
        """Deliver what is queued (for up to `timeout_s`), drop the rest, and release the client, so that
        no connection outlives the call (a client left to the garbage collector keeps reconnecting to
        a broker that is gone). Returns how many messages `send` queued were not delivered (as `flush`:
        dead letters dropped are counted only); sending afterwards fails."""
        undelivered = self.flush(timeout_s)
        if len(self._producer):
            self._producer.purge()
            self._producer.flush(0)  # the purged messages' delivery reports: counted as failed
        self._producer.close()
        return undelivered
