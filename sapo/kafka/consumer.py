"""The one consumer loop every service uses, and its confluent-kafka client.

Delivery semantics (at-least-once):
- Offsets are committed only for finished records. A record is finished when its handler returns
  `DONE`, when it is rejected (header prefilter, invalid payload -> dead-letter), or later, when the
  owner calls `finish()` for a record its handler `HELD` (a sampler's pooled group, a trainer's batch
  awaiting its checkpoint). The committed position of a partition never passes its lowest unfinished
  offset (`Watermarks`), so a crash re-delivers every unfinished record; idempotency keys
  (group id, batch id) make the second delivery harmless.
- librdkafka commits stored positions every auto.commit.interval.ms (the loop stores finished ones
  at most every `STORE_INTERVAL_S`); on revoke the loop commits
  synchronously before giving partitions up; on loss it commits nothing and drops the partitions'
  state (a commit that finds them lost already is skipped: the next poll reports the loss); on close
  it commits what is finished, and an owner's commit once the service is stopping only stores it for
  that close. A stopping service waits for that close only as long as its stop flag
  leaves for the broker (`sapo.lifecycle.StopFlag.broker_wait_s`): with the broker gone, librdkafka's
  close waits for a commit in flight until the group's session times out (45 s by default), past the
  grace period before SIGKILL. Such a close goes on in a thread the process does not wait for at exit;
  what it did not commit is re-delivered after the restart, as after a crash.
- Chunked messages (`sapo.kafka.chunks`) are reassembled before the handler sees them; a message's
  chunks stay unfinished until the message is, and what cannot be reassembled is counted,
  dead-lettered (its first chunk) and finished. A chunk refused alone (a header that lies, a forged
  chunk under an open message's id) is finished alone: the open message's offsets, below or around
  it, stay unfinished until the message is. The prefilter judges a chunked message once, by its
  first chunk's headers (the message's own): one it refuses is skipped chunk by chunk, never
  buffered; a first chunk under the id of a message already open is the reassembler's to judge.
- No message stops the loop: a handler raising `InvalidMessageError` has its record counted,
  dead-lettered and finished; any other exception a message causes is treated the same way under the
  reason "handler_error" (logged with its traceback: it is a bug to fix), unless the loop was built
  with `contain_errors=False` (the trainer, whose step failures are quarantined by attempts instead:
  `sapo.node.quarantine`). A `ServiceError` (a produce the broker refused, a fatal client error, a
  lost lease) is never contained: the service stops and its restart recovers. A record whose
  headers the client cannot read (a header name that is not UTF-8) is refused as "bad_header".
- A reader of a topic's whole history at every start (`history=True`: the compacted policy, keys and
  leases topics, read from the beginning by every process) dead-letters only what arrived after its
  start. When a partition is assigned it asks the broker where the partition ends; a record refused
  below that end was refused, and dead-lettered, by the processes that read it as it arrived, so it is
  counted and logged only: otherwise every restart would dead-letter it again and fire the dead-letter
  alert. A record written while no reader ran (a first start's included) is dead-lettered by none; it
  stays on the compacted topic until a newer record under its key replaces it. Where the broker cannot
  tell the end, every record counts as new.
"""

from __future__ import annotations

import enum
import logging
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition
from prometheus_client import Gauge

from sapo.clientlog import client_hooks
from sapo.kafka.chunks import CHUNK_REASONS, H_CHUNK, Incomplete, Reassembler, chunk_of
from sapo.kafka.dlq import DeadLetters
from sapo.kafka.errors import ServiceError
from sapo.kafka.lag import BrokersSetter, LagGauge
from sapo.kafka.metrics import TransportMetrics
from sapo.kafka.records import (
    AssignHook,
    ConsumerClient,
    OffsetPosition,
    Record,
    RevokeHook,
    TopicPartition,
    Watermarks,
)
from sapo.lifecycle import StopFlag
from sapo.wire import InvalidMessageError

log = logging.getLogger(__name__)
HISTORY_END_TIMEOUT_S: Final = 5.0
"""Longest wait for the broker to say where a history reader's partition ended when it was assigned."""

CONSUMER_DEFAULTS = {
    "enable.auto.commit": "true",
    "enable.auto.offset.store": "false",
    "auto.commit.interval.ms": "1000",
    # Committed offsets are the source of truth; the embedded broker's high watermark is unreliable.
    "auto.offset.reset": "earliest",
}


STORE_INTERVAL_S = 0.1
"""Finished positions are handed to librdkafka at most this often (and always on commit, revocation
and close). librdkafka commits what was stored every auto.commit.interval.ms (1 s), so storing more
often gains nothing, and storing after every record that moved a position cost a 10,000-node
sampler ~8 us a record (~10% of its CPU). A crash re-delivers at most this much more."""

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
"""Largest message a loop reassembles unless told otherwise (services pass their setting)."""


_UNKNOWN_PARTITION = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART})


class TransportError(ServiceError):
    """A fatal client error: the service must stop (and be restarted) rather than carry on."""


class KafkaConsumerClient:
    """`ConsumerClient` over confluent-kafka's Consumer. With `lag`, every assigned partition's unread
    messages are kept in that gauge from librdkafka's statistics (`sapo.kafka.lag`; the config's
    `statistics.interval.ms` says how often, 0 = never), and with `brokers_up` the brokers it is
    connected to. `setting` names where `bootstrap.servers` came from, for the error an unreachable
    cluster logs (`sapo.clientlog`)."""

    def __init__(
        self,
        config: dict[str, str],
        group_id: str,
        *,
        lag: Gauge | None = None,
        brokers_up: BrokersSetter | None = None,
        setting: str = "bootstrap.servers",
    ) -> None:
        self._lag = LagGauge(lag, brokers_up) if lag is not None else None
        callbacks = client_hooks(config, setting)
        if self._lag is not None:
            callbacks["stats_cb"] = self._lag.on_stats
        self._consumer = Consumer(CONSUMER_DEFAULTS | config | {"group.id": group_id} | callbacks)

    def subscribe(
        self, topics: Sequence[str], on_assign: AssignHook, on_revoke: RevokeHook, on_lost: RevokeHook
    ) -> None:
        def assigned(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            starts = on_assign([(p.topic, p.partition) for p in partitions])
            for p in partitions:
                if (p.topic, p.partition) in starts:
                    p.offset = starts[(p.topic, p.partition)]
            consumer.assign(partitions)

        def revoked(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            on_revoke([(p.topic, p.partition) for p in partitions])
            consumer.unassign()

        def lost(consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
            on_lost([(p.topic, p.partition) for p in partitions])
            consumer.unassign()

        self._consumer.subscribe(list(topics), on_assign=assigned, on_revoke=revoked, on_lost=lost)

    def poll(self, timeout: float) -> Record | None:
        msg = self._consumer.poll(timeout)
        return None if msg is None else to_record(msg)

    def store(self, positions: Sequence[OffsetPosition]) -> None:
        if positions:
            try:
                self._consumer.store_offsets(offsets=[KafkaTopicPartition(t, p, o) for t, p, o in positions])
            except KafkaException as exc:
                # A partition revoked in between cannot be stored; its next owner re-reads it.
                log.info("store_offsets skipped: %s", exc)

    def commit(self) -> None:
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            code = exc.args[0].code()
            if code == KafkaError._DESTROY:
                # Only while closing (the revocation on leaving the group commits): a service stopping
                # with its broker gone must not die in a traceback. The next owner re-reads from the
                # last commit, which the consumer loop's at-least-once contract allows.
                log.warning("final commit lost while closing: %s", exc)
            elif code in _GROUP_MOVED_ON:
                # The group moved the partitions on (no poll for max.poll.interval.ms: a long backend
                # call; the member dropped after session.timeout.ms; a rebalance under way): the next
                # poll reports them lost or revoked and their next owner re-reads them from the last
                # commit, as after any loss.
                log.warning("commit skipped, the group moved the partitions on: %s", exc)
            elif code in _COORDINATOR_UNKNOWN:
                # No coordinator to commit to right now (its broker gone or moving; seen in a close's
                # revocation as a generator stopped): the positions stay stored for the next commit,
                # and one that never comes leaves them to the next owner to re-read (at-least-once).
                log.warning("commit skipped, the group's coordinator is not known: %s", exc)
            elif code != KafkaError._NO_OFFSET:
                raise

    def offset_bounds(
        self, tps: Sequence[TopicPartition], timeout_s: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets (earliest, latest) per partition, asked of the broker (never librdkafka's cache).
        The embedded broker's latest can be too low (docs/architecture.md): use it where that is safe."""
        bounds: dict[TopicPartition, tuple[int, int]] = {}
        for topic, partition in tps:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    KafkaTopicPartition(topic, partition), timeout=timeout_s, cached=False
                )
            except KafkaException as exc:
                if exc.args[0].code() in _UNKNOWN_PARTITION:
                    continue
                raise TransportError(f"could not read the offsets of {topic}/{partition}: {exc}") from exc
            bounds[(topic, partition)] = (int(low), int(high))
        return bounds

    def close(self, wait_s: float | None = None) -> None:
        """With `wait_s`, the close runs in a thread waited for that long: what it raised by then is
        raised here, as a close in the caller's thread would; what it raises later is logged."""
        if wait_s is None:
            self._close()
            return
        lock = threading.Lock()
        # "error" once the close ended (None: it succeeded); "gave_up" once the caller stopped waiting.
        outcome: dict[str, Exception | None] = {}

        def close() -> None:
            error: Exception | None = None
            try:
                self._close()
            except Exception as exc:  # handed to the caller, or logged once it no longer waits
                error = exc
            with lock:
                if "gave_up" not in outcome:
                    outcome["error"] = error
                elif error is not None:
                    log.warning("consumer close failed after the stop stopped waiting for it: %r", error)

        closing = threading.Thread(target=close, name="consumer-close", daemon=True)
        closing.start()
        closing.join(wait_s)
        with lock:
            if "error" not in outcome:
                outcome["gave_up"] = None
                log.warning("consumer close not done within %.1f s: left to finish, or not, alone", wait_s)
                return
        if outcome["error"] is not None:
            raise outcome["error"]

    def _close(self) -> None:
        try:
            self._consumer.close()
        finally:
            if self._lag is not None:
                self._lag.clear()


READER_REFRESH_S = 300.0
"""How often a `KafkaReaderClient` looks for partitions added to its topics: librdkafka's own
topic.metadata.refresh.interval.ms, after which a group member learns of them too."""
READER_RETRY_S = 1.0
"""How soon a `KafkaReaderClient` asks again for a topic the cluster does not know (yet); the wait
doubles with every miss, up to `READER_RETRY_MAX_S`."""
READER_RETRY_MAX_S = 30.0
READER_METADATA_TIMEOUT_S = 1.0
"""Longest a metadata request may hold up a poll (only an unreachable cluster makes it wait)."""


class KafkaReaderClient(KafkaConsumerClient):
    """A `ConsumerClient` that reads every partition of its topics on its own, in no consumer group:
    for a process that must see a stream whole (the policy topic, the leases, a history read from the
    beginning), where a group of its own would have this one member.

    It starts each partition at the offset `on_assign` returns, else at its beginning, and commits
    nothing, so every start reads from there again, as a fresh group of its own did
    (auto.offset.reset=earliest, no committed offsets). Without a group there are no heartbeats and no
    join: a member's heartbeats cost the embedded broker ~1.1 ms of CPU a second, a third of an idle
    watcher's cost there, each join takes it session.timeout / 2, and every process start left a group
    behind on the cluster. A topic the cluster does not know yet is asked for again after
    `READER_RETRY_S`, then at doubling intervals up to `READER_RETRY_MAX_S` (a cluster that cannot be
    reached holds each such poll up for the metadata request's timeout); partitions added later are
    assigned (from their beginning) within `READER_REFRESH_S`. The group id only names the client:
    librdkafka wants one.
    """

    def __init__(
        self,
        config: dict[str, str],
        group_id: str,
        *,
        lag: Gauge | None = None,
        brokers_up: BrokersSetter | None = None,
        setting: str = "bootstrap.servers",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config = config | {"enable.auto.commit": "false"}
        super().__init__(config, group_id, lag=lag, brokers_up=brokers_up, setting=setting)
        self._clock = clock
        self._topics: list[str] = []
        self._on_assign: AssignHook | None = None
        self._check_at = float("inf")
        self._retry_s = READER_RETRY_S

    def subscribe(
        self, topics: Sequence[str], on_assign: AssignHook, on_revoke: RevokeHook, on_lost: RevokeHook
    ) -> None:
        """Assign every partition of `topics` the cluster knows now (no rebalance ever revokes or loses
        one: `on_revoke` and `on_lost` are never called)."""
        self._topics, self._on_assign = list(topics), on_assign
        self._assign_new()

    def poll(self, timeout: float) -> Record | None:
        if self._clock() >= self._check_at:
            self._assign_new()
        return super().poll(timeout)

    def store(self, positions: Sequence[OffsetPosition]) -> None:
        """Nothing is committed: a reader starts where `on_assign` says, or at the beginning."""

    def commit(self) -> None:
        """Nothing is committed (see `store`)."""

    def _assign_new(self) -> None:
        """Assign the partitions of the topics that are not assigned yet."""
        assert self._on_assign is not None
        assigned = {(p.topic, p.partition) for p in self._consumer.assignment()}
        found: list[TopicPartition] = []
        missing: list[str] = []
        for topic in self._topics:
            try:
                metadata = self._consumer.list_topics(topic, timeout=READER_METADATA_TIMEOUT_S)
            except KafkaException as exc:
                log.info("metadata of %s not read: %s", topic, exc)
                missing.append(topic)
                continue
            known = metadata.topics.get(topic)
            if known is None or known.error is not None or not known.partitions:
                missing.append(topic)
                continue
            found += [(topic, p) for p in sorted(known.partitions) if (topic, p) not in assigned]
        if missing:
            log.debug("topics %s unknown to the cluster; asking again in %.0f s", missing, self._retry_s)
            self._check_at = self._clock() + self._retry_s
            self._retry_s = min(2 * self._retry_s, READER_RETRY_MAX_S)
        else:
            self._check_at, self._retry_s = self._clock() + READER_REFRESH_S, READER_RETRY_S
        if not found:
            return
        starts = self._on_assign(found)
        self._consumer.incremental_assign(
            [KafkaTopicPartition(t, p, starts.get((t, p), OFFSET_BEGINNING)) for t, p in found]
        )


_HEADERS: Final = operator.methodcaller("headers")
"""`Message.headers()`, called through C so that CPython checks its result. confluent-kafka decodes
header names as UTF-8 and, on other bytes, returns a list holding a NULL with the UnicodeDecodeError
set: a checked call raises SystemError (from that error), but a call the interpreter has specialized
(any hot call site, such as a plain `msg.headers()` here) skips the check and the list then crashes
the process. One such record from any producer must not stop a service: it is returned without
headers and refused by the loop (`bad_header`)."""


_GROUP_MOVED_ON: Final = frozenset(
    {
        KafkaError._ASSIGNMENT_LOST,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
    }
)
"""Commit errors that mean this member's partitions are (being) handed on, not a failure of ours."""
_COORDINATOR_UNKNOWN: Final = frozenset(
    {KafkaError._WAIT_COORD, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR}
)
"""Commit errors that mean the group's coordinator cannot be reached now, not that the commit is wrong."""


def to_record(msg: Message) -> Record | None:
    """A consumed message as a Record; None for a non-fatal error event (logged: the client retries).
    Raises TransportError for a fatal one."""
    err = msg.error()
    if err is not None:
        if err.fatal():
            raise TransportError(f"fatal consumer error: {err}")
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error (retried by the client): %s", err)
        return None
    unreadable = ""
    try:
        raw_headers = _HEADERS(msg) or []
    except SystemError as exc:
        raw_headers, unreadable = [], f"a header name is not UTF-8 ({exc.__cause__ or exc})"
    pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
    headers = {str(k): _as_bytes(v) or b"" for k, v in pairs}
    return Record(
        topic=str(msg.topic()),
        partition=int(msg.partition() or 0),
        offset=int(msg.offset() or 0),
        key=_as_bytes(msg.key()),
        value=_as_bytes(msg.value()),
        headers=headers,
        timestamp_ms=msg.timestamp()[1],
        unreadable=unreadable,
    )


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


class Disposition(enum.Enum):
    DONE = "done"  # finished: the offset may be committed
    HELD = "held"  # the owner finishes it later with ConsumerLoop.finish()


MAX_SKIPPING: Final = 4096
"""Chunked messages refused before their last chunk that a loop remembers, to finish their later
chunks without reporting them again; past it the oldest is forgotten (its next chunk is then
refused once more, as `incomplete_message`, and the rest skipped again). A peer's flood of first
chunks it never follows up must not grow a consumer's memory for as long as it holds the partition."""

LOOP_REASONS: Final = ("bad_header", "handler_error", *CHUNK_REASONS)
"""What any loop may refuse a record for, whatever its handler and prefilter say: headers it cannot
read, a handler that raised something else than `InvalidMessageError`, a message that cannot be
reassembled."""

Handler = Callable[[Record], Disposition]
Prefilter = Callable[[Record], str | None]


class ConsumerLoop:
    """poll -> prefilter on headers -> handle -> store finished positions; see the module docstring."""

    def __init__(
        self,
        client: ConsumerClient,
        topics: Sequence[str],
        handler: Handler,
        *,
        stop: StopFlag,
        metrics: TransportMetrics,
        dead_letters: DeadLetters | None = None,
        prefilter: Prefilter | None = None,
        stream_of: Callable[[str], str] = lambda topic: "input",
        on_idle: Callable[[], None] | None = None,
        on_assign: AssignHook | None = None,
        on_revoke: RevokeHook | None = None,
        poll_timeout_s: float = 1.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        contain_errors: bool = True,
        history: bool = False,
    ) -> None:
        self._client = client
        self._history = history
        self._history_ends: dict[TopicPartition, int] = {}
        """Where each partition of a history reader ended when it was assigned."""
        self._stored_monotonic = -STORE_INTERVAL_S
        self._contain_errors = contain_errors
        self.opened = False
        """Whether `open` subscribed (the loop may be stepped)."""
        self._closed = False
        self._topics = list(topics)
        self._handler = handler
        self._stop = stop
        self._metrics = metrics
        self._dead_letters = dead_letters
        self._prefilter = prefilter
        self._stream_of = stream_of
        self._on_idle = on_idle
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._poll_timeout_s = poll_timeout_s
        self.watermarks = Watermarks()
        # Open messages may hold a few payloads' worth: enough for interleaved producers, still bounded.
        self._reassembler = Reassembler(max_payload_bytes, 4 * max_payload_bytes)
        self._skipping: OrderedDict[tuple[TopicPartition, str], str] = OrderedDict()
        """Chunked messages refused before their last chunk (by the prefilter on their first chunk's
        headers, or given up: too large, a chunk missing), and why: their later chunks are finished,
        not reported again."""
        self.assigned: set[TopicPartition] = set()
        self.last_poll_monotonic = time.monotonic()
        self.handled = 0

    def pending_count(self) -> int:
        """Records read and not finished yet."""
        return self.watermarks.pending_count()

    def finish(self, record: Record) -> None:
        """Mark a HELD record finished (every chunk of a reassembled one); its offsets become
        committable once earlier ones are too."""
        for part in record.offsets:
            self.watermarks.finish(part.tp, part.offset)

    def commit(self) -> None:
        """Store everything finished so far and commit it synchronously; once the stop flag is set,
        only store it. The close commits what is stored within the stop's bound on waits for the
        broker, where a synchronous commit to a broker gone since it acknowledged the output would
        block until the group's session times out."""
        self._client.store(self.watermarks.positions())
        if not self._stop.is_set():
            self._client.commit()

    def open(self) -> None:
        """Join the group; `step()` may be called from then on."""
        self._client.subscribe(self._topics, self._assigned, self._revoked, self._lost)
        self.opened = True
        self._metrics.track(self)

    def step(self, timeout_s: float | None = None) -> bool:
        """Poll once and handle what arrived; True when a record was read. Lets one thread drive
        several loops (a sampler's local and swarm streams may live on different clusters)."""
        record = self._client.poll(self._poll_timeout_s if timeout_s is None else timeout_s)
        self.last_poll_monotonic = time.monotonic()
        if record is None:
            if self._reassembler.has_open:
                self._sweep()
            if self._on_idle is not None:
                self._on_idle()
        else:
            self._dispatch(record)
        self._store_if_moved()
        return record is not None

    def run(
        self,
        *,
        max_records: int | None = None,
        until: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
        close: bool = True,
    ) -> int:
        """Consume until stopped, `max_records` were read, `until()` is true, or nothing arrived for
        `idle_timeout_s`. Returns the number of records read. Closes the client unless close=False."""
        self.open()
        read = 0
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set() and not (until is not None and until()):
                if max_records is not None and read >= max_records:
                    break
                if self.step():
                    read += 1
                    idle_since = time.monotonic()
                elif idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                    break
        finally:
            if close:
                self.close()
        return read

    def _dispatch(self, record: Record) -> None:
        self._metrics.consumed.inc(self._stream_of(record.topic))
        self.watermarks.seen(record.tp, record.offset)
        if record.unreadable:
            self._reject(record, InvalidMessageError("bad_header", f"{record.unreadable}; headers not kept"))
            return
        # Most records are whole messages with nothing open to sweep: they skip the reassembly.
        if H_CHUNK in record.headers or self._reassembler.has_open:
            # What went stale is given up first: a first chunk under its id is then judged as one under
            # a given-up id, not taken for that message's own past the prefilter (`_skipped_chunk`).
            self._sweep()
            if self._skipped_chunk(record):
                return
            assembled = self._reassembler.add(record)
            for incomplete in self._reassembler.take_dropped():
                self._drop(incomplete)
            if assembled is None:
                return
        else:
            assembled = record
        # A chunked message's verdict was given on its first chunk (`_skipped_chunk`), whose headers
        # are the message's: asking again would count it twice where the prefilter counts.
        reason = self._prefilter(assembled) if self._prefilter is not None and not assembled.parts else None
        if reason is not None:
            self._metrics.rejected.inc(reason)
            self.finish(assembled)
            return
        try:
            disposition = self._handler(assembled)
        except InvalidMessageError as exc:
            self._reject(assembled, exc)
            return
        except ServiceError:
            raise
        except Exception as exc:
            if not self._contain_errors:
                raise
            log.exception("handling %s/%d/%d failed", assembled.topic, assembled.partition, assembled.offset)
            self._reject(assembled, InvalidMessageError("handler_error", f"{type(exc).__name__}: {exc}"))
            return
        self.handled += 1
        if disposition is Disposition.DONE:
            self.finish(assembled)

    def _sweep(self) -> None:
        """Give up the open messages that went stale (`Reassembler.sweep`)."""
        self._reassembler.sweep()
        for incomplete in self._reassembler.take_dropped():
            self._drop(incomplete)

    def _skipped_chunk(self, record: Record) -> bool:
        """Finish a chunk of a message refused before its last chunk; True when it was one."""
        chunk = chunk_of(record)
        if chunk is None or chunk[0] < 0:  # a header that lies is refused alone, whatever id it names
            return False
        index, count, message_id = chunk
        slot = (record.tp, message_id)
        # A first chunk under an open message's id is not that message's start: the reassembler judges
        # it, so that a forged one the prefilter refuses cannot have the open message's chunks skipped.
        if (
            index == 0
            and self._prefilter is not None
            and not self._reassembler.is_open(*slot)
            and (reason := self._prefilter(record)) is not None
        ):
            self._metrics.rejected.inc(reason)
            self._skip(slot, reason)
        if slot not in self._skipping:
            return False
        if index == count - 1:
            del self._skipping[slot]
        self.finish(record)
        return True

    def _skip(self, slot: tuple[TopicPartition, str], reason: str) -> None:
        self._skipping[slot] = reason
        if len(self._skipping) > MAX_SKIPPING:
            self._skipping.popitem(last=False)

    def _drop(self, incomplete: Incomplete) -> None:
        """A message that cannot be reassembled: counted, its first chunk dead-lettered (unless another
        copy of it was delivered), all finished."""
        first = incomplete.parts[0]
        log.log(
            logging.INFO if incomplete.delivered else logging.WARNING,
            "dropped %d chunk(s) from %s/%d/%d: %s",
            len(incomplete.parts),
            first.topic,
            first.partition,
            first.offset,
            incomplete.reason,
        )
        self._metrics.rejected.inc(incomplete.reason)
        if not incomplete.delivered and (dlq := self._dead_letters_for(first)) is not None:
            dlq.send(first, incomplete.reason, f"{len(incomplete.parts)} chunk(s) given up")
        for part in incomplete.parts:
            self.finish(part)
        last = chunk_of(incomplete.parts[-1])
        if incomplete.more and last is not None:
            self._skip((first.tp, last[2]), incomplete.reason)  # one message, one rejection

    def _reject(self, record: Record, exc: InvalidMessageError) -> None:
        log.warning("rejected %s/%d/%d: %s", record.topic, record.partition, record.offset, exc)
        self._metrics.rejected.inc(exc.reason)
        if (dlq := self._dead_letters_for(record)) is not None:
            dlq.send(record, exc.reason, exc.detail)
        self.finish(record)

    def _dead_letters_for(self, record: Record) -> DeadLetters | None:
        """Where `record`, refused, goes: nowhere for one a history reader read before its start (see
        the module docstring)."""
        if record.offset < self._history_ends.get(record.tp, 0):
            log.info(
                "%s/%d/%d was on the topic before this start: not dead-lettered again",
                record.topic,
                record.partition,
                record.offset,
            )
            return None
        return self._dead_letters

    def _store_if_moved(self) -> None:
        now = self.last_poll_monotonic
        if now - self._stored_monotonic >= STORE_INTERVAL_S and self.watermarks.take_dirty():
            self._stored_monotonic = now
            self._client.store(self.watermarks.positions())

    def _assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.assigned.update(tps)
        log.info("assigned %s", tps)
        if self._history:
            try:
                bounds = self._client.offset_bounds(tps, HISTORY_END_TIMEOUT_S)
            except TransportError as exc:
                log.warning("end of %s not known (%s): every refused record is dead-lettered", tps, exc)
                bounds = {}
            self._history_ends.update({tp: bounds[tp][1] for tp in tps if tp in bounds})
        return self._on_assign(tps) if self._on_assign is not None else {}

    def _revoked(self, tps: list[TopicPartition]) -> None:
        log.info("revoked %s: committing finished offsets", tps)
        self._client.store(self.watermarks.positions())
        self._client.commit()
        self._forget(tps)

    def _lost(self, tps: list[TopicPartition]) -> None:
        log.warning("lost %s: their unfinished records will be re-delivered to the new owner", tps)
        self._forget(tps)

    def _forget(self, tps: list[TopicPartition]) -> None:
        if self._on_revoke is not None:
            self._on_revoke(tps)
        self._reassembler.forget(set(tps))
        self._skipping = OrderedDict((slot, r) for slot, r in self._skipping.items() if slot[0] not in tps)
        self.watermarks.drop(tps)
        self.assigned.difference_update(tps)

    def close(self) -> None:
        """Store finished positions and leave the group (the client commits them on close). Closing
        again does nothing, so an owner may close in a `finally` and once more on shutdown."""
        if self._closed:
            return
        self._closed = True
        self._metrics.untrack(self)
        try:
            self._client.store(self.watermarks.positions())
        finally:
            # An overrun is no sign of a broker gone (a LeaveGroup waits behind a JoinGroup in flight for
            # 5 s): only an unacknowledged produce ends the later waits (`StopFlag.broker_unanswered`).
            self._client.close(self._stop.broker_wait_s())
