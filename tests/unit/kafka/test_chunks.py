"""Chunked messages: split to the broker's limit, reassembled whole, and nothing that cannot be
reassembled (too large, cut short, tampered) holds a partition back."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import ConsumerLoop, DeadLetters, Disposition, Record, TransportMetrics
from sapo.kafka.chunks import (
    H_CHUNK,
    H_CHUNK_DIGESTS,
    H_CHUNK_ID,
    H_CHUNK_SHA,
    MAX_PINNED_CHUNKS,
    Reassembler,
    chunk_size,
    split,
)
from sapo.kafka.consumer import MAX_SKIPPING
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag

pytestmark = pytest.mark.unit
TP = ("t", 0)
Piece = tuple[bytes, list[tuple[str, bytes]]]
"""A message to send: its payload and headers (`split`'s output)."""


def records(pieces: list[tuple[bytes, list[tuple[str, bytes]]]], key: bytes, start: int = 0) -> list[Record]:
    return [Record("t", 0, start + i, key, value, dict(h)) for i, (value, h) in enumerate(pieces)]


def unpinned(pieces: list[Piece]) -> list[Piece]:
    """`pieces` as a writer that pins no chunk digests sends them (one that predates the pins)."""
    return [(value, [(k, v) for k, v in headers if k != H_CHUNK_DIGESTS]) for value, headers in pieces]


def test_small_messages_pass_unchanged_and_large_ones_split_within_the_limit() -> None:
    assert split(b"abc", [("h", b"1")], 10) == [(b"abc", [("h", b"1")])]
    value = os.urandom(25)
    pieces = split(value, [("h", b"1")], 10)
    assert [len(p) for p, _ in pieces] == [10, 10, 5]
    assert [dict(h)[H_CHUNK] for _, h in pieces] == [b"0/3", b"1/3", b"2/3"]
    assert all(dict(h)["h"] == b"1" for _, h in pieces)
    assert chunk_size(1024 * 1024) < 1024 * 1024


def test_chunks_reassemble_across_interleaved_producers() -> None:
    a, b = os.urandom(30), os.urandom(30)
    ra = records(split(a, [("n", b"a")], 10), b"ka")
    rb = records(split(b, [("n", b"b")], 10), b"kb", start=10)
    reassembler = Reassembler(1000, 100_000)
    out = [
        m for pair in zip(ra, rb, strict=True) for m in (reassembler.add(pair[0]), reassembler.add(pair[1]))
    ]
    whole = [m for m in out if m is not None]
    assert [m.value for m in whole] == [a, b]
    assert whole[0].headers == {"n": b"a"} and [p.offset for p in whole[0].parts] == [0, 1, 2]
    assert reassembler.pending_bytes == 0 and reassembler.take_dropped() == []


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda rs: rs[1:], "incomplete_message"),  # the first chunk is missing
        (lambda rs: [rs[0], rs[2]], "incomplete_message"),  # one in the middle
        (
            lambda rs: [*rs[:2], Record("t", 0, 9, b"k", b"x" * 5, dict(rs[2].headers))],
            "chunk_digest_mismatch",
        ),
    ],
)
def test_messages_that_cannot_be_reassembled_are_given_up(mutate: object, reason: str) -> None:
    """As an older writer sends them, with no chunk digests pinned (a pinned message refuses a chunk
    that is not its next one alone: `test_a_forged_chunk_under_a_pinned_message_s_id_is_refused_alone`)."""
    pieces = records(unpinned(split(os.urandom(25), [], 10)), b"k")
    reassembler = Reassembler(1000, 1000)
    for record in mutate(pieces):  # type: ignore[operator]
        assert reassembler.add(record) is None
    assert reason in [d.reason for d in reassembler.take_dropped()]


def test_a_copy_of_the_payload_completing_gives_up_the_cut_short_one() -> None:
    value = os.urandom(25)
    pieces = split(value, [], 10)
    first = records(pieces, b"node/7")
    again = records(split(value, [], 10), b"node/7", start=3)  # the same payload, sent again
    reassembler = Reassembler(1000, 100_000)
    reassembler.add(first[0])  # its producer died after one chunk
    assembled = [reassembler.add(r) for r in again]
    dropped = reassembler.take_dropped()
    assert [(d.reason, d.delivered, d.parts) for d in dropped] == [("superseded", True, (first[0],))]
    assert assembled[-1] is not None and assembled[-1].value == value
    assert not reassembler.has_open


def test_a_first_chunk_under_a_peers_key_leaves_the_peers_message_open() -> None:
    """Keys are public: a forged first chunk (or a whole other message) under a peer's key must not
    drop the peer's message in flight, and a forged copy that completes is not its payload."""
    value = os.urandom(25)
    honest = records(split(value, [], 10), b"node/7")
    forged = records(split(os.urandom(25), [], 10), b"node/7", start=10)
    reassembler = Reassembler(1000, 100_000)
    assert reassembler.add(honest[0]) is None
    assert [reassembler.add(r) for r in forged][-1] is not None  # completes: another payload
    assert reassembler.take_dropped() == []
    assembled = [reassembler.add(r) for r in honest[1:]]
    assert assembled[-1] is not None and assembled[-1].value == value
    assert reassembler.take_dropped() == []


def test_the_first_chunk_pins_the_digest_of_every_chunk_within_a_bound() -> None:
    value = os.urandom(25)
    pieces = split(value, [], 10)
    pins = dict(pieces[0][1])[H_CHUNK_DIGESTS]
    assert pins == b"".join(hashlib.sha256(piece).digest() for piece, _ in pieces)
    assert all(H_CHUNK_DIGESTS not in dict(headers) for _, headers in pieces[1:])
    assert H_CHUNK_DIGESTS not in dict(split(value, [], 25)[0][1])  # a whole message: nothing to pin
    pinned = split(os.urandom(MAX_PINNED_CHUNKS), [], 1)
    assert len(dict(pinned[0][1])[H_CHUNK_DIGESTS]) == 32 * MAX_PINNED_CHUNKS  # 32 KiB: half the headroom
    unpinned_ = split(os.urandom(MAX_PINNED_CHUNKS + 1), [], 1)
    assert H_CHUNK_DIGESTS not in dict(unpinned_[0][1])  # too many to fit the headroom: sent as before


def forged(real: Record, offset: int, **change: Any) -> Record:
    """A chunk a peer writes under `real`'s message id: `real` at `offset`, with `change` applied."""
    return dataclasses.replace(real, offset=offset, **change)


FORGERIES: dict[str, Callable[[list[Record], list[Record]], Record]] = {
    "another payload": lambda rs, _: forged(rs[2], 50, value=b"x" * 10),
    "the first chunk again": lambda rs, _: forged(rs[0], 50),
    "a chunk already taken": lambda rs, _: forged(rs[1], 50),
    "a real chunk not yet due": lambda rs, cut: forged(
        cut[3], 50, headers={**cut[3].headers, H_CHUNK_ID: rs[0].headers[H_CHUNK_ID]}
    ),
    "another count": lambda rs, _: forged(rs[2], 50, headers={**rs[2].headers, H_CHUNK: b"2/5"}),
}
"""Chunks that are not the message's next one (its third of four), each written after its second:
`rs` are the message's records, `cut` those of a copy of the same payload under another id, cut short
(a peer copies a chunk of it whose digest the message pinned)."""


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_forged_chunk_under_a_pinned_message_s_id_is_refused_alone(
    forge: Callable[[list[Record], list[Record]], Record],
) -> None:
    """The message's id is public once its first chunk is on the topic: a chunk written under it
    dropped the message in flight. It is refused alone now and the message completes."""
    value = os.urandom(40)
    honest = records(split(value, [], 10), b"k")
    cut = records(split(value, [], 10), b"k", start=20)
    reassembler = Reassembler(1000, 100_000)
    assert [reassembler.add(r) for r in honest[:2]] == [None, None]
    bad = forge(honest, cut)
    assert reassembler.add(bad) is None
    dropped = reassembler.take_dropped()
    assert [(d.reason, d.parts, d.more) for d in dropped] == [("forged_chunk", (bad,), False)]
    assembled = [reassembler.add(r) for r in honest[2:]][-1]
    assert assembled is not None and assembled.value == value
    assert [p.offset for p in assembled.parts] == [0, 1, 2, 3]  # the forged chunk is none of them
    assert reassembler.take_dropped() == [] and reassembler.pending_bytes == 0


def test_a_message_an_older_writer_did_not_pin_is_dropped_by_a_forged_chunk_as_before() -> None:
    honest = records(unpinned(split(os.urandom(30), [], 10)), b"k")
    reassembler = Reassembler(1000, 100_000)
    bad = forged(honest[1], 50, value=b"x" * 10)
    assert [reassembler.add(r) for r in (honest[0], bad, *honest[1:])] == [None] * 4
    given_up = reassembler.take_dropped()[0]
    assert (given_up.reason, given_up.parts) == ("incomplete_message", (honest[0], bad, honest[1]))


@pytest.mark.parametrize(
    "pins",
    [b"", b"\0" * 95, b"\0" * 97, b"\0" * 96],
    ids=["empty", "short", "long", "not the first chunk's"],
)
def test_a_first_chunk_with_a_malformed_digests_header_is_a_bad_chunk_header(pins: bytes) -> None:
    first = records(split(os.urandom(30), [], 10), b"k")[0]
    reassembler = Reassembler(1000, 100_000)
    bad = dataclasses.replace(first, headers={**first.headers, H_CHUNK_DIGESTS: pins})
    assert reassembler.add(bad) is None
    assert [(d.reason, d.more) for d in reassembler.take_dropped()] == [("bad_chunk_header", True)]
    assert not reassembler.has_open


def test_oversized_and_stale_messages_are_given_up() -> None:
    now = [0.0]
    reassembler = Reassembler(15, 1000, stale_s=60, clock=lambda: now[0])
    first = records(split(os.urandom(25), [], 10), b"k")[0]
    assert reassembler.add(first) is None  # 3 chunks of 10 bytes: at least 21 bytes, refused at once
    assert [(d.reason, d.parts) for d in reassembler.take_dropped()] == [("oversized", (first,))]
    big_last = records(split(os.urandom(14), [], 10), b"m")  # within the bound at its first chunk
    reassembler.add(big_last[0])
    assert reassembler.take_dropped() == []
    now[0] = 61.0  # and then nothing: its producer died
    reassembler.add(Record("t", 0, 50, b"x", b"plain", {}))
    assert [d.reason for d in reassembler.take_dropped()] == ["incomplete_message"]
    assert reassembler.pending_bytes == 0


def first_chunks_of_nothing(count: int) -> list[Record]:
    """One peer's flood: the first of two chunks of `count` empty messages, each under its own id."""
    return [
        Record(
            "t", 0, i, f"k{i}".encode(), b"", {H_CHUNK: b"0/2", H_CHUNK_ID: f"{i}".encode(), H_CHUNK_SHA: b""}
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("key_bytes", [2, 10_000])
def test_chunks_of_nothing_count_against_the_pending_limit(key_bytes: int) -> None:
    """Their payloads weigh nothing, but holding each costs memory (more with a large key): the flood
    is given up, oldest first, and what is held stays within the limit."""
    reassembler = Reassembler(1000, 50_000)
    for record in first_chunks_of_nothing(200):
        assert reassembler.add(dataclasses.replace(record, key=(record.key or b"").zfill(key_bytes))) is None
    dropped = reassembler.take_dropped()
    assert {d.reason for d in dropped} == {"evicted_incomplete"} and len(dropped) > 150
    assert [d.parts[0].offset for d in dropped] == list(range(len(dropped)))
    assert 0 < reassembler.pending_bytes <= 50_000
    assert (200 - len(dropped)) * key_bytes <= 50_000  # the keys held fit the limit too


class CountedVisits(OrderedDict[Any, Any]):
    """The reassembler's open messages, counting every entry a scan of them visits."""

    visits = 0

    def __iter__(self) -> Iterator[Any]:
        for key in super().__iter__():
            self.visits += 1
            yield key

    def items(self) -> Any:
        return ((key, self[key]) for key in self)


def test_each_chunk_costs_constant_time_however_many_messages_are_open() -> None:
    """Every record used to scan every open message (the stale ones, the key's earlier copy): a
    flood of 20,000 first chunks took minutes of a consumer's CPU and slowed every record after it."""
    reassembler = Reassembler(1000, 1 << 40)
    reassembler._open = counted = CountedVisits()
    flood = 20_000
    for record in first_chunks_of_nothing(flood):
        reassembler.add(record)
    whole = Record("t", 0, flood, b"k", b"whole", {})
    assert reassembler.add(whole) is whole
    assert counted.visits <= 2 * (flood + 1)  # a scan per record visited ~flood^2 / 2 = 2e8
    assert reassembler.take_dropped() == [] and reassembler.has_open


@pytest.mark.parametrize("header", [b"5/2", b"0/" + b"9" * 5000], ids=["index past count", "5000 digits"])
def test_a_forged_chunk_header_is_given_up(header: bytes) -> None:
    """Also a count int() refuses to read (over 4,300 digits): that error stopped the consumer."""
    forged = Record("t", 0, 0, b"k", b"x", {H_CHUNK: header, "sapo-chunk-id": b"a", H_CHUNK_SHA: b"0"})
    reassembler = Reassembler(100, 100)
    assert reassembler.add(forged) is None
    assert [d.reason for d in reassembler.take_dropped()] == ["bad_chunk_header"]


class Collecting:
    """A consumer loop over topic "t" of `bus` that keeps every message it is handed, with dead
    letters on "dlq" and its transport metrics in `registry`."""

    def __init__(self, bus: MemoryBus, publisher: MemoryPublisher) -> None:
        self.seen: list[Record] = []
        self.registry = CollectorRegistry()
        transport = TransportMetrics(self.registry, "test")
        self.loop = ConsumerLoop(
            MemoryConsumerClient(bus, "g"),
            ["t"],
            self._handle,
            stop=StopFlag(),
            metrics=transport,
            dead_letters=DeadLetters(publisher, "dlq", "test", transport),
            poll_timeout_s=0.0,
        )

    def _handle(self, record: Record) -> Disposition:
        self.seen.append(record)
        return Disposition.DONE

    def values(self) -> list[bytes | None]:
        return [r.value for r in self.seen]


def test_the_consumer_loop_hands_over_whole_messages_and_commits_every_chunk() -> None:
    bus = MemoryBus()
    publisher = MemoryPublisher(bus, max_message_bytes=128 * 1024)
    big = os.urandom(300 * 1024)
    publisher.send("t", b"big", big, [("kind", b"group")])
    publisher.send("t", b"small", b"tiny", [])
    assert len(bus.topics["t"]) == 6  # five 64 KiB chunks (128 KiB less the headroom) and the small one
    bus.append("t", b"lone", b"x", [(H_CHUNK, b"1/2"), ("sapo-chunk-id", b"zz"), (H_CHUNK_SHA, b"0")])
    consumer = Collecting(bus, publisher)
    assert consumer.loop.run(idle_timeout_s=0.0) == 7
    assert [(r.key, r.value) for r in consumer.seen] == [(b"big", big), (b"small", b"tiny")]
    assert consumer.seen[0].headers == {"kind": b"group"}
    assert bus.committed[("g", ("t", 0))] == 7  # every chunk and the lone piece finished
    rejected = consumer.registry.get_sample_value(
        "sapo_test_messages_rejected_total", {"reason": "incomplete_message"}
    )
    assert rejected == 1
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"incomplete_message"]


def test_whole_messages_between_the_chunks_of_another_pass_through_the_loop() -> None:
    bus = MemoryBus()
    big = os.urandom(25)
    pieces = split(big, [], 10)
    bus.append("t", b"a", *pieces[0])
    bus.append("t", b"b", b"between", [])
    for value, headers in pieces[1:]:
        bus.append("t", b"a", value, headers)
    bus.append("t", b"c", b"after", [])
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == 5
    assert consumer.values() == [b"between", big, b"after"]
    assert bus.committed[("g", ("t", 0))] == 5


def test_a_whole_message_gives_up_a_stale_open_one_in_the_loop() -> None:
    """The loop hands whole messages past the reassembler only while nothing is open: with a message
    left open, the next whole one still sweeps it once it is stale (counted, dead-lettered, committed)."""
    bus = MemoryBus()
    bus.append("t", b"a", *split(os.urandom(25), [], 10)[0])  # its producer died after one chunk
    bus.append("t", b"b", b"later", [])
    consumer = Collecting(bus, MemoryPublisher(bus))
    loop = consumer.loop
    now = [0.0]
    loop._reassembler = Reassembler(1000, 1000, stale_s=60, clock=lambda: now[0])
    loop.open()
    assert loop.step() and loop.pending_count() == 1  # the open chunk holds its offset
    now[0] = 61.0
    assert loop.step()
    loop.commit()
    assert consumer.values() == [b"later"]
    assert bus.committed[("g", ("t", 0))] == 2
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"incomplete_message"]


def test_an_oversized_message_is_refused_once_and_all_its_chunks_are_committed() -> None:
    bus = MemoryBus()
    for value, headers in split(os.urandom(25), [], 10):
        bus.append("t", b"big", value, headers)
    bus.append("t", b"small", b"fits", [])
    consumer = Collecting(bus, MemoryPublisher(bus))
    consumer.loop._reassembler = Reassembler(15, 1000)
    assert consumer.loop.run(idle_timeout_s=0.0) == 4
    assert consumer.values() == [b"fits"]
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"oversized"]  # not twice
    assert bus.committed[("g", ("t", 0))] == 4


def test_a_lone_chunk_on_a_quiet_topic_is_given_up_by_an_empty_poll() -> None:
    """Nothing follows the first chunk (its producer died): the stale message must not hold the
    partition's commits until some other record arrives."""
    bus = MemoryBus()
    bus.append("t", b"a", *split(os.urandom(25), [], 10)[0])
    consumer = Collecting(bus, MemoryPublisher(bus))
    loop = consumer.loop
    now = [0.0]
    loop._reassembler = Reassembler(1000, 1000, stale_s=60, clock=lambda: now[0])
    loop.open()
    assert loop.step() and loop.pending_count() == 1
    now[0] = 61.0
    assert not loop.step()  # nothing to read: the sweep still runs
    loop.commit()
    assert bus.committed[("g", ("t", 0))] == 1
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"incomplete_message"]


def test_first_chunks_never_followed_up_are_remembered_within_a_bound() -> None:
    """A peer's flood of first chunks of messages too large to take, never sent further: each is
    refused and committed, and what the loop keeps to skip their later chunks stays bounded."""
    bus = MemoryBus()
    flood = MAX_SKIPPING + 100
    for i in range(flood):
        bus.append("t", f"k{i}".encode(), b"x", [(H_CHUNK, b"0/1000000000"), (H_CHUNK_ID, f"{i}".encode())])
    bus.append("t", b"ok", b"valid", [])
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == flood + 1
    assert consumer.values() == [b"valid"]
    assert bus.committed[("g", ("t", 0))] == flood + 1
    rejected = consumer.registry.get_sample_value(
        "sapo_test_messages_rejected_total", {"reason": "oversized"}
    )
    assert rejected == flood
    assert len(consumer.loop._skipping) == MAX_SKIPPING


def test_a_forged_chunk_header_under_a_skipped_message_s_id_is_refused_and_ends_no_skip() -> None:
    """A chunk header that lies (index past count) is refused alone as bad_chunk_header, also under
    the id of a message the loop skips: it was taken for that message's last chunk, finished unseen,
    and the skip ended, so the message's real later chunk was refused a second time."""
    bus = MemoryBus()
    chunk = [(H_CHUNK_ID, b"m"), (H_CHUNK_SHA, b"0")]
    bus.append("t", b"k", b"x", [(H_CHUNK, b"0/1000000000"), *chunk])  # oversized: its later chunks skipped
    bus.append("t", b"k", b"x", [(H_CHUNK, b"5/2"), *chunk])
    bus.append("t", b"k", b"x", [(H_CHUNK, b"1/1000000000"), *chunk])
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == 3
    assert bus.committed[("g", ("t", 0))] == 3
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"oversized", b"bad_chunk_header"]
    assert list(consumer.loop._skipping) == [(("t", 0), "m")]


def test_a_chunk_id_too_long_to_remember_is_a_forged_chunk_header() -> None:
    """What the loop remembers of refused messages is bounded by count: ids of 100 KB each would have
    made that bound ~400 MB (a megabyte each, 4 GB). Such a chunk is refused alone and forgotten."""
    bus = MemoryBus()
    for i in range(20):
        chunk_id = b"i" * 100_000 + str(i).encode()
        bus.append("t", b"k", b"x", [(H_CHUNK, b"0/1000000000"), (H_CHUNK_ID, chunk_id), (H_CHUNK_SHA, b"0")])
    bus.append("t", b"ok", b"valid", [])
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == 21
    assert consumer.values() == [b"valid"]
    assert bus.committed[("g", ("t", 0))] == 21
    rejected = "sapo_test_messages_rejected_total"
    assert consumer.registry.get_sample_value(rejected, {"reason": "bad_chunk_header"}) == 20
    assert len(consumer.loop._skipping) == 0


@pytest.mark.parametrize(
    "mutate",
    [
        lambda rs: rs[:2] + rs[3:],  # a chunk lost in the middle
        lambda rs: rs[:3] + rs[2:],  # a chunk sent twice (a producer retry without idempotence)
    ],
    ids=["lost", "twice"],
)
def test_a_message_broken_in_the_middle_is_one_rejection_and_all_its_chunks_are_committed(
    mutate: Callable[[list[Piece]], list[Piece]],
) -> None:
    """Its later chunks cannot form a message either: skipped, not dead-lettered one by one. As an
    older writer sends them (a pinned message refuses a chunk out of place alone: below)."""
    bus = MemoryBus()
    pieces = mutate(unpinned(split(os.urandom(60), [], 10)))
    for value, headers in pieces:
        bus.append("t", b"big", value, headers)
    bus.append("t", b"small", b"after", [])
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == len(pieces) + 1
    assert consumer.values() == [b"after"]
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"incomplete_message"]
    rejected = consumer.registry.get_sample_value(
        "sapo_test_messages_rejected_total", {"reason": "incomplete_message"}
    )
    assert rejected == 1
    assert bus.committed[("g", ("t", 0))] == len(pieces) + 1


def test_a_forged_chunk_in_the_loop_is_refused_alone_and_the_open_message_s_offsets_stay_held() -> None:
    """Finishing the forged chunk finishes its offset alone: the commit stays at the open message's
    first chunk until the message, taken whole, is finished."""
    bus = MemoryBus()
    value = os.urandom(40)
    pieces = split(value, [], 10)
    for piece in pieces[:2]:
        bus.append("t", b"big", *piece)
    bus.append("t", b"big", b"x" * 10, pieces[2][1])  # a peer's, under the open message's id
    consumer = Collecting(bus, MemoryPublisher(bus))
    loop = consumer.loop
    loop.open()
    while loop.step():
        pass
    loop.commit()
    assert bus.committed[("g", ("t", 0))] == 0 and loop.pending_count() == 2
    for piece in pieces[2:]:
        bus.append("t", b"big", *piece)
    bus.append("t", b"small", b"after", [])
    while loop.step():
        pass
    loop.commit()
    assert consumer.values() == [value, b"after"]
    assert [p.offset for p in consumer.seen[0].parts] == [0, 1, 3, 4]
    dead = bus.topics["dlq"]
    assert [(r.headers["sapo-dlq-reason"], r.headers["sapo-dlq-source"]) for r in dead] == [
        (b"forged_chunk", b"t/0/2")
    ]
    assert bus.committed[("g", ("t", 0))] == 6 and loop.pending_count() == 0


def test_a_pinned_message_s_chunk_sent_twice_is_refused_alone_and_the_message_taken() -> None:
    """A copy of a chunk already taken (a peer's, or a producer's retry) no longer drops the message."""
    bus = MemoryBus()
    value = os.urandom(30)
    pieces = split(value, [], 10)
    for piece in [*pieces[:2], pieces[1], pieces[2]]:
        bus.append("t", b"big", *piece)
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == 4
    assert consumer.values() == [value]
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"forged_chunk"]
    assert bus.committed[("g", ("t", 0))] == 4


def test_a_pinned_message_missing_a_chunk_is_given_up_when_stale() -> None:
    """Its later chunks are refused one by one (each could be a peer's), and the message, which can
    no longer complete, is given up after the stale window; every offset is committed."""
    bus = MemoryBus()
    pieces = split(os.urandom(50), [], 10)
    for piece in [*pieces[:2], *pieces[3:]]:
        bus.append("t", b"big", *piece)
    consumer = Collecting(bus, MemoryPublisher(bus))
    loop = consumer.loop
    now = [0.0]
    loop._reassembler = Reassembler(1000, 1000, stale_s=60, clock=lambda: now[0])
    loop.open()
    while loop.step():
        pass
    now[0] = 61.0
    assert not loop.step()
    loop.commit()
    assert consumer.values() == []
    reasons = [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]]
    assert reasons == [b"forged_chunk", b"forged_chunk", b"incomplete_message"]
    assert bus.committed[("g", ("t", 0))] == 4


def test_a_stale_message_whose_later_chunks_come_after_all_is_one_rejection() -> None:
    """Its producer stalled past the stale window (a partition leader away for minutes), then sent the
    rest: given up once by the sweep, the later chunks are skipped, not each a new rejection."""
    bus = MemoryBus()
    pieces = split(os.urandom(60), [], 10)
    bus.append("t", b"big", *pieces[0])
    consumer = Collecting(bus, MemoryPublisher(bus))
    loop = consumer.loop
    now = [0.0]
    loop._reassembler = Reassembler(1000, 1000, stale_s=60, clock=lambda: now[0])
    loop.open()
    assert loop.step()
    now[0] = 61.0
    assert not loop.step()  # the sweep gives the message up
    for value, headers in pieces[1:]:
        bus.append("t", b"big", value, headers)
    while loop.step():
        pass
    loop.commit()
    assert consumer.values() == []
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics["dlq"]] == [b"incomplete_message"]
    assert bus.committed[("g", ("t", 0))] == len(pieces)


def test_copies_two_replicas_interleave_are_both_handed_over_without_a_dead_letter() -> None:
    """Two replicas sending the same group under its key (the work partition moved on mid-call): each
    copy is handed over whole (the handler dedupes them), and neither is dead-lettered."""
    bus = MemoryBus()
    first, again = os.urandom(30), os.urandom(30)
    for one, other in zip(split(first, [], 10), split(again, [], 10), strict=True):
        bus.append("t", b"group", *one)
        bus.append("t", b"group", *other)
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == 6
    assert consumer.values() == [first, again]
    assert "dlq" not in bus.topics
    assert bus.committed[("g", ("t", 0))] == 6


def test_a_cut_short_copy_is_counted_not_dead_lettered_once_its_payload_arrives_whole() -> None:
    bus = MemoryBus()
    value = os.urandom(30)
    bus.append("t", b"group", *split(value, [], 10)[0])  # its producer died after one chunk
    for piece in split(value, [], 10):  # sent again by the producer that took over
        bus.append("t", b"group", *piece)
    consumer = Collecting(bus, MemoryPublisher(bus))
    assert consumer.loop.run(idle_timeout_s=0.0) == 4
    assert consumer.values() == [value]
    assert "dlq" not in bus.topics
    rejected = consumer.registry.get_sample_value(
        "sapo_test_messages_rejected_total", {"reason": "superseded"}
    )
    assert rejected == 1
    assert bus.committed[("g", ("t", 0))] == 4
