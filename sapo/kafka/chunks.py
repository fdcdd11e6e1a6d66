"""Messages of any size on topics whose brokers keep Kafka's default message limit: chunking.

A payload larger than the producer's chunk size is sent as consecutive chunk messages with the same
key (so the same partition), each carrying the headers of the whole message plus:

- `sapo-chunk`: `<index>/<count>` (0-based),
- `sapo-chunk-id`: one id for the message, the same on every chunk,
- `sapo-chunk-sha256`: the digest of the whole payload, checked when it is reassembled,
- on the first chunk only, `sapo-chunk-digests`: the raw SHA-256 of every chunk in order (32 bytes
  each, the first's own included), when the message has at most `MAX_PINNED_CHUNKS` chunks.

Consumers reassemble (`Reassembler`): the chunks of one message arrive in order within their
partition (one producer, idempotent), possibly interleaved with other producers' messages. The
assembled `Record` carries every chunk record in `parts`, so finishing it finishes all of their
offsets and at-least-once delivery holds for the whole message. Memory is bounded: a message over
`max_payload_bytes` is refused at its first chunk (every chunk but the last is as long as the first,
so the first and the count bound the whole), and when the chunks held exceed `max_pending_bytes` the
message that went longest without a chunk is given up. A held chunk counts its key, headers and
`HELD_RECORD_BYTES` besides its payload, so a flood of chunks of nothing (one peer's first chunks of
empty messages, each under a new id) is bounded too. A message cut short (the producer died
mid-message) never completes: it is given up as `superseded` when a copy of the same payload (its
key and digest) completes in its partition (a producer sent the message again: a restarted one, or a
second generator replica that took over the work item), or after `stale_s` without a new chunk
(`sweep`, which the consumer loop also runs when a poll returns nothing, so a quiet topic does not
hold it open), so its offsets do not hold the partition's commits back for long. A message is never
given up because another one starts under its key: keys are public (group and batch ids), and a
single forged first chunk under a peer's key would otherwise drop that peer's message in flight; a
forged copy that completes cannot carry the digest of the real payload.

A forged chunk under the open message's own id (public once its first chunk is on the topic),
written between its chunks, is told from the real one by the digests its first chunk pinned: a
chunk that is not the message's next one as pinned (another index, even a real chunk's copied from a
cut-short copy of the same payload; another count; another digest than pinned at its index) is
refused alone (`forged_chunk`), and the message stays open for its real next chunk (a refused chunk
does not put off its going stale). A chunk the writer lost (a delivery that timed out between two
that did not) thus leaves the message open until `stale_s`, its later chunks each refused alone; a
loss costs the message either way. Nobody but the writer can pin: the first chunk is on the topic
before its id is known to anyone else (ids are random), and a record on a topic cannot be changed.
The first chunk is checked against its own pin too: a digests header of another length than 32
bytes a chunk, or one its own chunk does not match, is a chunk header that lies (`bad_chunk_header`,
its message's later chunks skipped). A message whose first chunk pins nothing (an older writer, or
more than `MAX_PINNED_CHUNKS` chunks) is dropped by such a forged chunk as before
(`incomplete_message` or `chunk_digest_mismatch`): nothing tells it from the real one before the
whole payload's digest is checked. Readers that predate the pins read every header by name, so they
reassemble as before and only hand the header on among the assembled message's, where nothing
reads it. Pinning costs a chunked message one more SHA-256 pass on each side (under 1 ms a MiB);
a whole message costs nothing more.

Each of these costs constant time however many messages are open: they are kept in the order of
their latest chunk and indexed by key and digest, since the loop hands every record to the
reassembler while one is open. What cannot be assembled (too large, cut short, a digest mismatch, a
forged chunk) comes back as an `Incomplete` whose records the caller finishes, counts and
dead-letters, except a superseded copy (`delivered`), which is counted only: its payload was
delivered whole. One given up before its last chunk says so (`more`), and the caller skips its later
chunks.

Why chunking rather than raising limits: Apache Kafka's broker limit is about 1 MB by default, a
reasoning-length rollout group (16 completions x 8k tokens with token ids and log-probs) is larger,
and a training batch of 16 such groups is tens of MB. Chunking keeps every broker, topic and producer
at its default while no payload size is special anywhere else in the code.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from sapo.kafka.records import Header, Record, TopicPartition

H_CHUNK: Final = "sapo-chunk"
H_CHUNK_ID: Final = "sapo-chunk-id"
H_CHUNK_SHA: Final = "sapo-chunk-sha256"
H_CHUNK_DIGESTS: Final = "sapo-chunk-digests"
CHUNK_HEADERS: Final = (H_CHUNK, H_CHUNK_ID, H_CHUNK_SHA, H_CHUNK_DIGESTS)
SUPERSEDED: Final = "superseded"
"""The reason a cut-short copy is given up once another copy of its payload completed."""
BAD_CHUNK_HEADER: Final = "bad_chunk_header"
FORGED_CHUNK: Final = "forged_chunk"
"""The reason a chunk is refused alone under an open message whose first chunk pinned another."""
CHUNK_REASONS: Final = (
    BAD_CHUNK_HEADER,
    "incomplete_message",
    "oversized",
    "evicted_incomplete",
    "chunk_digest_mismatch",
    FORGED_CHUNK,
    SUPERSEDED,
)
"""Every reason an `Incomplete` gives (a superseded copy is counted, never dead-lettered)."""
HELD_RECORD_BYTES: Final = 1024
"""What holding a chunk costs beyond its payload, key and headers (the record's objects), as counted
against the pending limit."""
MAX_CHUNK_DIGITS: Final = 20
"""Digits of a `sapo-chunk` index or count (any 64-bit number); a longer one is a header that lies."""
MAX_CHUNK_ID_BYTES: Final = 128
"""Longest `sapo-chunk-id` (`split` writes 32 hex digits); a longer one is a header that lies. Readers
keep ids as keys, of open messages and of refused ones whose later chunks they skip (a bound by count
there: `sapo.kafka.consumer.MAX_SKIPPING`), so a peer's megabyte ids must not become those keys."""
HEADROOM_BYTES: Final = 64 * 1024
"""Kept free in every message for headers and the record framing, so a chunk plus its overhead fits
the broker's limit."""
DIGEST_BYTES: Final = hashlib.sha256().digest_size
MAX_PINNED_CHUNKS: Final = 1024
"""Most chunks whose digests a writer pins on the first chunk: 32 KiB of raw digests, half of
`HEADROOM_BYTES`, leaving the other half to the message's own headers. Raw rather than hex: twice the
chunks in the same headroom and no decoding (any 32 bytes are a digest, so the length is all a reader
checks). A message of more chunks (over ~1 GB at the default 1 MiB message limit, or a limit set far
below it) goes out unpinned. Readers take a pin of any count: its length is bound to the count, and
the broker already took the record."""


def chunk_size(max_message_bytes: int) -> int:
    """The payload bytes of one chunk for a broker that accepts `max_message_bytes` per message."""
    return max(1024, max_message_bytes - HEADROOM_BYTES)


def split(value: bytes, headers: Sequence[Header], size: int) -> list[tuple[bytes, list[Header]]]:
    """The (payload, headers) messages to send for `value`: itself when it fits, else its chunks."""
    if len(value) <= size:
        return [(value, list(headers))]
    count = -(-len(value) // size)
    message_id = uuid.uuid4().hex.encode()
    digest = hashlib.sha256(value).hexdigest().encode()
    base = [(k, v) for k, v in headers if k not in CHUNK_HEADERS]
    pieces = [
        (
            value[i * size : (i + 1) * size],
            [*base, (H_CHUNK, f"{i}/{count}".encode()), (H_CHUNK_ID, message_id), (H_CHUNK_SHA, digest)],
        )
        for i in range(count)
    ]
    if count <= MAX_PINNED_CHUNKS:
        pieces[0][1].append(
            (H_CHUNK_DIGESTS, b"".join(hashlib.sha256(piece).digest() for piece, _ in pieces))
        )
    return pieces


def chunk_of(record: Record) -> tuple[int, int, str] | None:
    """(index, count, message id) of a chunk record; None for an ordinary message."""
    raw, message_id = record.headers.get(H_CHUNK), record.headers.get(H_CHUNK_ID)
    if raw is None or message_id is None:
        return None
    index, _, count = raw.decode("ascii", "replace").partition("/")
    # Bounded before int(), which refuses more than 4,300 digits with an error a peer must not cause.
    digits = index.isdigit() and count.isdigit() and max(len(index), len(count)) <= MAX_CHUNK_DIGITS
    if not digits or not int(index) < int(count) or len(message_id) > MAX_CHUNK_ID_BYTES:
        return (-1, 0, message_id.decode("ascii", "replace"))  # a chunk header that lies
    return int(index), int(count), message_id.decode("ascii", "replace")


@dataclass(frozen=True)
class Incomplete:
    """Chunk records that will never form a message, and why (a bounded metric label)."""

    reason: str
    parts: tuple[Record, ...]
    more: bool = False
    """Whether the message's later chunks are still to come (it was given up at a chunk before its
    last): the consumer skips them, so that one message is one rejection."""

    @property
    def delivered(self) -> bool:
        """Whether another copy of the payload was handed over whole: nothing to dead-letter."""
        return self.reason == SUPERSEDED


_Copy = tuple[TopicPartition, bytes | None, bytes]
"""A payload in a partition: (partition, key, digest header); its copies are the same message."""


@dataclass
class _Open:
    count: int
    copy: _Copy
    last_s: float
    parts: list[Record] = field(default_factory=list)
    size: int = 0
    """Payload bytes so far."""
    held: int = 0
    """What its chunks count against the pending limit (`_held_bytes`)."""
    pins: bytes | None = None
    """The first chunk's `sapo-chunk-digests` (`DIGEST_BYTES` a chunk), None when it pinned nothing."""


class Reassembler:
    """Open messages per (partition, message id); see the module docstring."""

    def __init__(
        self,
        max_payload_bytes: int,
        max_pending_bytes: int,
        stale_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_payload = max_payload_bytes
        self._max_pending = max_pending_bytes
        self._stale_s = stale_s
        self._clock = clock
        self._open: OrderedDict[tuple[TopicPartition, str], _Open] = OrderedDict()
        """Ordered by their latest chunk, least recent first."""
        self._copies: dict[_Copy, dict[tuple[TopicPartition, str], None]] = {}
        """The open messages of each payload: a set, in the order they opened."""
        self._pending = 0
        self.dropped: list[Incomplete] = []
        """Given-up messages since the last `take_dropped`."""

    @property
    def pending_bytes(self) -> int:
        return self._pending

    @property
    def has_open(self) -> bool:
        """Whether a message is open (a stale one is given up by the next `add`)."""
        return bool(self._open)

    def is_open(self, tp: TopicPartition, message_id: str) -> bool:
        """Whether a message is open under `message_id` in `tp`."""
        return (tp, message_id) in self._open

    def add(self, record: Record) -> Record | None:
        """The assembled message once `record` completes it, else None (the chunk is held; check
        `take_dropped` for what was given up)."""
        now = self.sweep()
        found = chunk_of(record)
        if found is None:
            return record
        index, count, message_id = found
        slot = (record.tp, message_id)
        if index < 0:
            self.dropped.append(Incomplete(BAD_CHUNK_HEADER, (record,)))
            return None
        current = self._open.get(slot)
        if current is None:
            if index != 0:  # the start went to another consumer, or is gone
                self.dropped.append(Incomplete("incomplete_message", (record,), index < count - 1))
                return None
            if (count - 1) * len(record.value or b"") >= self._max_payload:
                self.dropped.append(Incomplete("oversized", (record,), more=count > 1))
                return None
            pins = record.headers.get(H_CHUNK_DIGESTS)
            if pins is not None and (len(pins) != count * DIGEST_BYTES or not _pinned(pins, 0, record)):
                self.dropped.append(Incomplete(BAD_CHUNK_HEADER, (record,), more=count > 1))
                return None
            copy = (record.tp, record.key, record.headers.get(H_CHUNK_SHA, b""))
            current = self._open[slot] = _Open(count, copy, now, pins=pins)
            self._copies.setdefault(copy, {})[slot] = None
        elif current.pins is not None and (
            index != len(current.parts) or count != current.count or not _pinned(current.pins, index, record)
        ):
            # Not the writer's next chunk: refused alone, the message waits for that one.
            self.dropped.append(Incomplete(FORGED_CHUNK, (record,)))
            return None
        elif index != len(current.parts) or count != current.count:  # a chunk lost, or sent twice
            self._give_up(slot, "incomplete_message", extra=(record,), more=index < count - 1)
            return None
        current.parts.append(record)
        current.last_s = now
        self._open.move_to_end(slot)
        current.size += len(record.value or b"")
        held = _held_bytes(record)
        current.held += held
        self._pending += held
        if current.size > self._max_payload:
            self._give_up(slot, "oversized", more=index < count - 1)
            return None
        while self._pending > self._max_pending and len(self._open) > 1:
            oldest = next(iter(self._open))
            if oldest == slot:
                break
            self._give_up(oldest, "evicted_incomplete", more=True)
        if len(current.parts) < current.count:
            return None
        return self._assemble(slot)

    def sweep(self) -> float:
        """Give up open messages with no new chunk for `stale_s`; returns the clock's time."""
        now = self._clock()
        while self._open:
            slot, oldest = next(iter(self._open.items()))
            if now - oldest.last_s <= self._stale_s:
                break
            self._give_up(slot, "incomplete_message", more=True)  # its producer may only have stalled
        return now

    def _pop(self, slot: tuple[TopicPartition, str]) -> _Open:
        current = self._open.pop(slot)
        copies = self._copies[current.copy]
        del copies[slot]
        if not copies:
            del self._copies[current.copy]
        self._pending -= current.held
        return current

    def _assemble(self, slot: tuple[TopicPartition, str]) -> Record | None:
        current = self._pop(slot)
        value = b"".join(part.value or b"" for part in current.parts)
        first = current.parts[0]
        expected = first.headers.get(H_CHUNK_SHA, b"").decode("ascii", "replace")
        if hashlib.sha256(value).hexdigest() != expected:
            self.dropped.append(Incomplete("chunk_digest_mismatch", tuple(current.parts)))
            return None
        for other in list(self._copies.get(current.copy, ())):  # copies a dead producer cut short
            self._give_up(other, SUPERSEDED, more=True)
        headers = {k: v for k, v in first.headers.items() if k not in CHUNK_HEADERS}
        return replace(first, value=value, headers=headers, parts=tuple(current.parts))

    def _give_up(
        self,
        slot: tuple[TopicPartition, str],
        reason: str,
        extra: tuple[Record, ...] = (),
        *,
        more: bool = False,
    ) -> None:
        current = self._pop(slot)
        self.dropped.append(Incomplete(reason, (*current.parts, *extra), more))

    def forget(self, tps: set[TopicPartition]) -> None:
        """Drop open messages of revoked partitions (their chunks are delivered again to the new owner)."""
        for slot in [s for s in self._open if s[0] in tps]:
            self._pop(slot)

    def take_dropped(self) -> list[Incomplete]:
        dropped, self.dropped = self.dropped, []
        return dropped


def _pinned(pins: bytes, index: int, record: Record) -> bool:
    """Whether `record` is the chunk `pins` pinned at `index`."""
    pinned = pins[index * DIGEST_BYTES : (index + 1) * DIGEST_BYTES]
    return hashlib.sha256(record.value or b"").digest() == pinned


def _held_bytes(record: Record) -> int:
    """What holding `record` counts against the pending limit: payload, key, headers and the record."""
    headers = sum(len(name) + len(value) for name, value in record.headers.items())
    return len(record.value or b"") + len(record.key or b"") + headers + HELD_RECORD_BYTES
