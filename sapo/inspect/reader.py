"""Reading sapo topics from outside, without disturbing the services that own them.

The reader is assigned its partitions explicitly: it joins no consumer group (so no service's group
rebalances, and no join waits `session.timeout.ms / 2` on the embedded broker), its group id is unique
per run and it never commits an offset.

Where the end of a partition is cannot be asked of the embedded broker (its high watermark and its
offsets-for-times answers are wrong, and lower than the truth when measured), so the end is where
nothing arrived for `idle_s`, as in the services' own recovery. Broker answers are used only as
hints for where to start, and records before the wanted start are skipped by timestamp:

- beginning: every retained record, until idle (or forever with `follow`).
- since T: from the offsets-for-times hint; records with a timestamp before T are skipped.
- end: records that arrive from now on (implies follow). Starts from the offsets-for-times hint for
  now; a record older than the start is skipped until the partitions were first idle (then every
  record is new, whatever a skewed producer clock stamped on it).
- last N: the newest N matching records. Per partition it reads from a hint of N before the high
  watermark until idle; a partition that gave fewer than N matches is read again from twice as far
  back, until it has N or its start reached the low watermark. The newest N of those, by timestamp,
  are shown; `follow` then continues where each partition stopped.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from sapo.clientlog import LIBRDKAFKA_LOG
from sapo.inspect.decode import Entry
from sapo.kafka import Record
from sapo.kafka.consumer import to_record
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag

log = logging.getLogger(__name__)

READER_DEFAULTS: Final = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "auto.offset.reset": "earliest",
}
POLL_S: Final = 0.1
StartMode = Literal["beginning", "end", "last", "since"]


class InspectError(RuntimeError):
    """The cluster or a topic could not be read; the message says which and what to check."""


@dataclass(frozen=True)
class Start:
    """Where reading begins: `count` is N of `last`, `since_ms` the time of `since`."""

    mode: StartMode = "beginning"
    count: int = 0
    since_ms: int = 0


@dataclass(frozen=True)
class Bounds:
    """When reading ends: after `max_messages` matched entries, after `duration_s`, when nothing
    arrived for `idle_s` (unless `follow`), or on the stop flag, whichever comes first."""

    max_messages: int | None = None
    duration_s: float | None = None
    follow: bool = False
    idle_s: float = 2.0


@dataclass
class Stats:
    """What a read did: records read, skipped as before the start, and entries that matched."""

    partitions: int = 0
    read: int = 0
    skipped: int = 0
    matched: int = 0


class Sink(Protocol):
    """Where matched entries go (a table, JSON lines, a summary)."""

    def add(self, entry: Entry) -> None: ...

    def tick(self) -> None:
        """Called when a poll returned nothing, so live displays can refresh."""


class TopicReader:
    """A consumer with explicitly assigned partitions: no group join, no commits."""

    def __init__(self, config: Mapping[str, str], timeout_s: float = 10.0) -> None:
        group = f"sapo-inspect-{uuid.uuid4().hex[:12]}"
        self._consumer = Consumer(dict(config) | READER_DEFAULTS | {"group.id": group}, logger=LIBRDKAFKA_LOG)
        self._timeout_s = timeout_s
        self._servers = config.get("bootstrap.servers", "?")

    def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        """Every partition of `topics`; InspectError naming the topics that do not exist."""
        found: list[TopicPartition] = []
        missing: list[str] = []
        for topic in topics:
            try:
                metadata = self._consumer.list_topics(topic, timeout=self._timeout_s).topics[topic]
            except KafkaException as exc:
                raise InspectError(
                    f"could not read metadata of {topic} from {self._servers} within {self._timeout_s} s: "
                    f"{exc}; check --bootstrap and the security settings"
                ) from None
            if metadata.error is not None or not metadata.partitions:
                missing.append(topic)
            found += [(topic, p) for p in sorted(metadata.partitions)]
        if missing:
            raise InspectError(f"no such topic(s) at {self._servers}: {', '.join(missing)}")
        return found

    def topic_names(self) -> list[str]:
        try:
            return sorted(self._consumer.list_topics(timeout=self._timeout_s).topics)
        except KafkaException as exc:
            raise InspectError(f"could not list topics at {self._servers}: {exc}") from None

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        """(low, high) as the broker reports them: hints only (module docstring)."""
        low, high = self._consumer.get_watermark_offsets(
            KafkaTopicPartition(*tp), timeout=self._timeout_s, cached=False
        )
        return int(low), int(high)

    def offsets_for_time(self, tps: Sequence[TopicPartition], time_ms: int) -> dict[TopicPartition, int]:
        """The broker's first offset at or after `time_ms` per partition (a hint); its high watermark
        where the broker knows no such record."""
        answers = self._consumer.offsets_for_times(
            [KafkaTopicPartition(t, p, time_ms) for t, p in tps], timeout=self._timeout_s
        )
        hints = {(a.topic, a.partition): a.offset for a in answers}
        return {tp: offset if offset >= 0 else self.watermarks(tp)[1] for tp, offset in hints.items()}

    def assign(self, positions: Mapping[TopicPartition, int]) -> None:
        self._consumer.assign([KafkaTopicPartition(t, p, offset) for (t, p), offset in positions.items()])

    def poll(self, timeout_s: float) -> Record | None:
        msg = self._consumer.poll(timeout_s)
        return None if msg is None else to_record(msg)

    def close(self) -> None:
        self._consumer.close()


@dataclass
class _Gate:
    """Skips records older than `not_before_ms`, until the partitions were first idle if `until_idle`."""

    not_before_ms: int = 0
    until_idle: bool = False
    opened: bool = False

    def passes(self, record: Record) -> bool:
        return self.opened or record.timestamp_ms >= self.not_before_ms


def _records(
    reader: TopicReader, bounds: Bounds, stop: StopFlag, on_idle: Callable[[], bool]
) -> Iterator[Record | None]:
    """Records until the duration is over, the stop flag is set, or (when `on_idle()` says to stop)
    nothing arrived for `idle_s`; None after each empty poll."""
    deadline = None if bounds.duration_s is None else time.monotonic() + bounds.duration_s
    idle_since = time.monotonic()
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        record = reader.poll(POLL_S)
        if record is not None:
            idle_since = time.monotonic()
            yield record
            continue
        if time.monotonic() - idle_since >= bounds.idle_s:
            if on_idle():
                return
            idle_since = time.monotonic()
        yield None


def read(
    reader: TopicReader,
    tps: Sequence[TopicPartition],
    start: Start,
    bounds: Bounds,
    *,
    convert: Callable[[Record], Entry],
    keep: Callable[[Entry], bool],
    sink: Sink,
    stop: StopFlag,
) -> Stats:
    """Read the partitions `tps` from `start` within `bounds`; matched entries go to `sink`."""
    stats = Stats(partitions=len(tps))
    follow = bounds.follow or start.mode == "end"
    gate = _Gate()
    if start.mode == "last":
        newest, positions = _last(
            reader, tps, start.count, bounds=bounds, convert=convert, keep=keep, stats=stats, stop=stop
        )
        for entry in newest[: bounds.max_messages]:
            sink.add(entry)
            stats.matched += 1
        if not follow or (bounds.max_messages is not None and stats.matched >= bounds.max_messages):
            return stats
    elif start.mode in ("since", "end"):
        since = start.since_ms if start.mode == "since" else int(time.time() * 1000)
        positions = reader.offsets_for_time(tps, since)
        gate = _Gate(not_before_ms=since, until_idle=start.mode == "end")
    else:
        for tp in tps:  # also opens the connections to every leader before the idle clock starts
            reader.watermarks(tp)
        positions = dict.fromkeys(tps, OFFSET_BEGINNING)
    reader.assign(positions)
    log.info(
        "reading %d partition(s) from %s%s",
        len(tps),
        _where(start),
        ", following" if follow else f", until {bounds.idle_s:g} s without a message",
    )

    def on_idle() -> bool:
        gate.opened = gate.opened or gate.until_idle
        return not follow

    for record in _records(reader, bounds, stop, on_idle):
        if record is None:
            sink.tick()
            continue
        stats.read += 1
        if not gate.passes(record):
            stats.skipped += 1
            continue
        entry = convert(record)
        if keep(entry):
            sink.add(entry)
            stats.matched += 1
            if bounds.max_messages is not None and stats.matched >= bounds.max_messages:
                break
    return stats


def _where(start: Start) -> str:
    if start.mode == "since":
        return f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start.since_ms / 1000))} UTC"
    return {"beginning": "the beginning", "end": "now", "last": f"after the last {start.count}"}[start.mode]


def _last(
    reader: TopicReader,
    tps: Sequence[TopicPartition],
    count: int,
    *,
    bounds: Bounds,
    convert: Callable[[Record], Entry],
    keep: Callable[[Entry], bool],
    stats: Stats,
    stop: StopFlag,
) -> tuple[list[Entry], dict[TopicPartition, int]]:
    """The newest `count` matching entries of `tps` (oldest first), and where each partition stopped."""
    marks = {tp: reader.watermarks(tp) for tp in tps}
    span = dict.fromkeys(tps, count)
    starts = {tp: max(low, high - count) for tp, (low, high) in marks.items()}
    kept: dict[TopicPartition, collections.deque[Entry]] = {}
    positions = dict(starts)
    todo = dict(starts)
    until_idle = Bounds(idle_s=bounds.idle_s)
    while todo and not stop.is_set():
        reader.assign(todo)
        found = {tp: collections.deque[Entry](maxlen=count) for tp in todo}
        for record in _records(reader, until_idle, stop, on_idle=lambda: True):
            if record is None or record.tp not in found:
                continue
            stats.read += 1
            positions[record.tp] = max(positions[record.tp], record.offset + 1)
            entry = convert(record)
            if keep(entry):
                found[record.tp].append(entry)
        kept.update(found)
        short = [tp for tp in todo if len(found[tp]) < count and todo[tp] > marks[tp][0]]
        for tp in short:
            span[tp] *= 2
        todo = {tp: max(marks[tp][0], marks[tp][1] - span[tp], 0) for tp in short}
        if todo:
            log.debug("reading further back for the last %d: %s", count, todo)
    merged = sorted(
        (e for entries in kept.values() for e in entries),
        key=lambda e: (e.timestamp_ms, e.topic, e.partition, e.offset),
    )
    return merged[-count:], positions
