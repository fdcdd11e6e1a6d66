"""The consumer loop's delivery rules, driven for real over the in-memory transport."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import (
    ConsumerLoop,
    DeadLetters,
    Disposition,
    ProduceError,
    Record,
    TransportMetrics,
    Watermarks,
)
from sapo.kafka.chunks import Reassembler, split
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag
from sapo.v1 import rollout_pb2
from sapo.wire import InvalidMessageError, decode
from tests.factories import make_group

pytestmark = pytest.mark.unit


def _loop(
    bus: MemoryBus, handler: object, group: str = "g", stop: StopFlag | None = None, **kwargs: object
) -> tuple[ConsumerLoop, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = TransportMetrics(registry, "test")
    dlq = DeadLetters(MemoryPublisher(bus), "dlq", "test", metrics)
    loop = ConsumerLoop(
        MemoryConsumerClient(bus, group),
        ["in"],
        handler,  # type: ignore[arg-type]
        stop=stop or StopFlag(),
        metrics=metrics,
        dead_letters=dlq,
        poll_timeout_s=0.0,
        **kwargs,  # type: ignore[arg-type]
    )
    return loop, registry


def _collecting(handled: list[bytes]) -> Callable[[Record], Disposition]:
    """A handler that keeps each record's value in `handled`."""

    def handle(record: Record) -> Disposition:
        handled.append(record.value or b"")
        return Disposition.DONE

    return handle


def _own_node(record: Record) -> str | None:
    """A prefilter refusing the records of this node (`me`)."""
    return "own_node" if record.headers.get("sapo-node-id") == b"me" else None


def test_watermark_never_passes_lowest_unfinished() -> None:
    marks = Watermarks()
    for offset in (5, 6, 7):
        marks.seen(("t", 0), offset)
    marks.finish(("t", 0), 6)
    marks.finish(("t", 0), 7)
    assert marks.positions() == [("t", 0, 5)]
    marks.finish(("t", 0), 5)
    assert marks.positions() == [("t", 0, 8)]


def test_done_records_are_committed_and_not_redelivered() -> None:
    bus = MemoryBus()
    for i in range(3):
        bus.append("in", None, b"%d" % i, [])
    seen: list[bytes] = []

    def handle(record: Record) -> Disposition:
        seen.append(record.value or b"")
        return Disposition.DONE

    loop, _ = _loop(bus, handle)
    assert loop.run(idle_timeout_s=0.0) == 3
    assert bus.committed[("g", ("in", 0))] == 3
    again, _ = _loop(bus, handle)
    assert again.run(idle_timeout_s=0.0) == 0


def test_a_commit_while_stopping_is_left_to_the_close() -> None:
    """Once stopping, an owner's commit only stores: the close commits within the stop's bound, where a
    synchronous commit to a broker gone since its acknowledgement would wait out the group's session."""
    bus = MemoryBus()
    for i in range(3):
        bus.append("in", None, b"%d" % i, [])
    stop = StopFlag(5.0)
    loop, _ = _loop(bus, _collecting([]), stop=stop)
    loop.open()
    while loop.step(0.0):
        pass
    stop.set("test")
    loop.commit()
    assert ("g", ("in", 0)) not in bus.committed
    loop.close()
    assert bus.committed[("g", ("in", 0))] == 3


def test_held_records_are_redelivered_after_a_crash() -> None:
    bus = MemoryBus()
    for i in range(4):
        bus.append("in", None, b"%d" % i, [])
    held: list[Record] = []

    def hold(record: Record) -> Disposition:
        held.append(record)
        return Disposition.HELD

    loop, _ = _loop(bus, hold)
    loop.run(idle_timeout_s=0.0, close=False)
    loop.finish(held[0])
    loop.finish(held[2])  # out of order: the commit must stop before offset 1
    loop.commit()
    assert bus.committed[("g", ("in", 0))] == 1

    redelivered: list[bytes] = []

    def collect(record: Record) -> Disposition:
        redelivered.append(record.value or b"")
        return Disposition.DONE

    again, _ = _loop(bus, collect)
    again.run(idle_timeout_s=0.0)
    assert redelivered == [b"1", b"2", b"3"]


def test_invalid_payload_is_dead_lettered_counted_and_skipped() -> None:
    bus = MemoryBus()
    bus.append("in", b"k1", b"\xff\xff", [("sapo-node-id", b"n1")])
    good = make_group()
    bus.append("in", b"k2", good.SerializeToString(), [])
    bus.append("in", b"k3", b"", [])
    decoded: list[str] = []

    def handle(record: Record) -> Disposition:
        decoded.append(decode(rollout_pb2.RolloutGroup, record.value, 1 << 20).group_id)
        return Disposition.DONE

    loop, registry = _loop(bus, handle)
    loop.run(idle_timeout_s=0.0)
    assert decoded == [good.group_id]
    dlq = bus.topics["dlq"]
    assert [r.value for r in dlq] == [b"\xff\xff", b""]
    assert dlq[0].key == b"k1"
    assert dlq[0].headers["sapo-dlq-reason"] == b"undecodable"
    assert dlq[0].headers["sapo-node-id"] == b"n1"
    assert registry.get_sample_value("sapo_test_messages_dead_lettered_total", {"reason": "undecodable"}) == 1
    # An empty value: no message of ours encodes to nothing.
    assert dlq[1].headers["sapo-dlq-reason"] == b"empty_payload"
    assert bus.committed[("g", ("in", 0))] == 3


def test_prefilter_drops_without_calling_the_handler() -> None:
    bus = MemoryBus()
    bus.append("in", None, b"\xff", [("sapo-node-id", b"me")])
    bus.append("in", None, b"ok", [("sapo-node-id", b"peer")])
    handled: list[bytes] = []
    handle = _collecting(handled)

    loop, registry = _loop(bus, handle, prefilter=_own_node)
    loop.run(idle_timeout_s=0.0)
    assert handled == [b"ok"]
    assert registry.get_sample_value("sapo_test_messages_rejected_total", {"reason": "own_node"}) == 1


def test_prefilter_judges_a_chunked_message_once() -> None:
    bus = MemoryBus()
    value = bytes(range(256)) * 4
    for piece, headers in split(value, [("sapo-node-id", b"peer")], 300):
        bus.append("in", b"k", piece, headers)
    bus.append("in", None, b"ok", [("sapo-node-id", b"peer")])
    judged: list[int] = []
    handled: list[bytes] = []
    handle = _collecting(handled)

    def count(record: Record) -> str | None:
        judged.append(record.offset)
        return None

    loop, _ = _loop(bus, handle, prefilter=count)
    loop.run(idle_timeout_s=0.0)
    assert handled == [value, b"ok"]
    assert judged == [0, len(bus.topics["in"]) - 1]


def test_a_first_chunk_under_an_open_message_s_id_is_not_prefiltered_for_that_message() -> None:
    """A peer's copy of an open message's first chunk with a header the prefilter refuses had the
    loop skip that id, so the open message's real chunks were finished unread and it never completed.
    It is the reassembler's to judge: refused alone, the message taken."""
    bus = MemoryBus()
    value = bytes(range(256)) * 4
    pieces = split(value, [("sapo-node-id", b"peer")], 300)
    bus.append("in", b"k", *pieces[0])
    forged = [(k, b"me" if k == "sapo-node-id" else v) for k, v in pieces[0][1]]
    bus.append("in", b"k", pieces[0][0], forged)
    for piece in pieces[1:]:
        bus.append("in", b"k", *piece)
    handled: list[bytes] = []
    handle = _collecting(handled)

    loop, registry = _loop(bus, handle, prefilter=_own_node)
    loop.run(idle_timeout_s=0.0)
    assert handled == [value]
    rejected = "sapo_test_messages_rejected_total"
    assert registry.get_sample_value(rejected, {"reason": "forged_chunk"}) == 1
    assert registry.get_sample_value(rejected, {"reason": "own_node"}) is None
    assert bus.committed[("g", ("in", 0))] == len(pieces) + 1


def test_a_first_chunk_under_a_stale_message_s_id_is_not_taken_past_the_prefilter() -> None:
    """A message left open (its writer died after one chunk) and stale: a first chunk under its id is
    not that message's, and is judged as one under a given-up id, never handed over unfiltered (here
    a whole message in one chunk, which the prefilter refuses)."""
    bus = MemoryBus()
    first, headers = split(bytes(300), [("sapo-node-id", b"peer")], 100)[0]
    bus.append("in", b"k", first, headers)
    message_id = dict(headers)["sapo-chunk-id"]
    whole = b"refused"
    one = [
        ("sapo-node-id", b"me"),
        ("sapo-chunk", b"0/1"),
        ("sapo-chunk-id", message_id),
        ("sapo-chunk-sha256", hashlib.sha256(whole).hexdigest().encode()),
    ]
    handled: list[bytes] = []
    handle = _collecting(handled)

    loop, registry = _loop(bus, handle, prefilter=_own_node)
    now = [0.0]
    loop._reassembler = Reassembler(1000, 1000, stale_s=60, clock=lambda: now[0])
    loop.open()
    assert loop.step()
    now[0] = 61.0
    bus.append("in", b"k", whole, one)
    assert loop.step()
    loop.commit()
    assert handled == []
    rejected = "sapo_test_messages_rejected_total"
    assert registry.get_sample_value(rejected, {"reason": "own_node"}) == 1
    assert registry.get_sample_value(rejected, {"reason": "incomplete_message"}) == 1
    assert bus.committed[("g", ("in", 0))] == 2


def test_stop_flag_and_until_end_the_loop() -> None:
    bus = MemoryBus()
    for i in range(10):
        bus.append("in", None, b"%d" % i, [])
    count = 0

    def handle(record: Record) -> Disposition:
        nonlocal count
        count += 1
        return Disposition.DONE

    loop, _ = _loop(bus, handle)
    loop.run(until=lambda: count >= 4)
    assert count == 4


def test_a_message_that_breaks_the_handler_is_dead_lettered_and_the_loop_goes_on() -> None:
    bus = MemoryBus()
    bus.append("in", None, b"x", [])
    bus.append("in", None, b"y", [])
    seen: list[bytes] = []

    def broken(record: Record) -> Disposition:
        if record.value == b"x":
            raise KeyError("bug")
        seen.append(record.value or b"")
        return Disposition.DONE

    loop, registry = _loop(bus, broken)
    assert loop.run(idle_timeout_s=0.0) == 2
    assert seen == [b"y"]
    assert bus.committed[("g", ("in", 0))] == 2
    labels = {"reason": "handler_error"}
    assert registry.get_sample_value("sapo_test_messages_dead_lettered_total", labels) == 1
    assert bus.topics["dlq"][0].headers["sapo-dlq-detail"].startswith(b"KeyError")


def test_uncontained_handler_errors_and_service_errors_propagate() -> None:
    bus = MemoryBus()
    bus.append("in", None, b"x", [])

    def broken(record: Record) -> Disposition:
        raise KeyError("bug")

    loop, _ = _loop(bus, broken, contain_errors=False)
    with pytest.raises(KeyError):
        loop.run(idle_timeout_s=0.0)
    assert bus.committed.get(("g", ("in", 0)), 0) == 0

    def fenced(record: Record) -> Disposition:
        raise ProduceError("fatal", "the producer is gone")

    loop, _ = _loop(bus, fenced)
    with pytest.raises(ProduceError):
        loop.run(idle_timeout_s=0.0)
    assert bus.committed.get(("g", ("in", 0)), 0) == 0


def test_invalid_message_error_carries_reason() -> None:
    exc = InvalidMessageError("oversized", "9 > 8")
    assert exc.reason == "oversized"
    assert "9 > 8" in str(exc)


def test_a_history_reader_dead_letters_only_what_arrived_after_its_start() -> None:
    """A topic read whole at every start: what was refused before the start (by the loop itself too,
    as an unreadable chunk) was dead-lettered then; only later refusals are dead-lettered now."""
    bus = MemoryBus()
    bus.append("in", None, b"old", [])
    bus.append("in", b"k", *split(b"x" * 30, [], 10)[1])  # a chunk whose start is gone

    def refuse(record: Record) -> Disposition:
        raise InvalidMessageError("undecodable", (record.value or b"").decode())

    loop, registry = _loop(bus, refuse, history=True)
    loop.open()
    while loop.step():
        pass
    assert "dlq" not in bus.topics
    rejected = registry.get_sample_value
    assert rejected("sapo_test_messages_rejected_total", {"reason": "undecodable"}) == 1
    assert rejected("sapo_test_messages_rejected_total", {"reason": "incomplete_message"}) == 1
    bus.append("in", None, b"new", [])
    while loop.step():
        pass
    assert [r.value for r in bus.topics["dlq"]] == [b"new"]
