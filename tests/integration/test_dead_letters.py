"""Dead letters against the real broker: whatever a hostile producer put on a topic, its dead letter
fits one message of the node's own limit, and a dead letter that cannot be sent stops nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import (
    ConsumerLoop,
    DeadLetters,
    Disposition,
    Handler,
    KafkaPublisher,
    Record,
    TransportMetrics,
)
from sapo.kafka.chunks import chunk_size
from sapo.kafka.dlq import H_DETAIL, H_HEADERS_DROPPED, H_ORIGINAL_BYTES, H_ORIGINAL_SHA, H_REASON
from sapo.lifecycle import StopFlag
from sapo.wire import InvalidMessageError
from tests.integration.kafka_helpers import consumer, create_topics, make_loop
from tests.integration.raw_producer import produce_raw

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024  # Apache Kafka's default message.max.bytes, the services' default


def _hostile_producer(bootstrap: str) -> KafkaPublisher:
    """A producer that ignores the swarm's limit (the embedded broker, like a misconfigured topic,
    does not enforce max.message.bytes)."""
    return KafkaPublisher({"bootstrap.servers": bootstrap}, max_message_bytes=16 * LIMIT)


def _loop(bootstrap: str, group: str, topic: str, handler: Handler, dlq: DeadLetters) -> ConsumerLoop:
    return ConsumerLoop(
        consumer(bootstrap, group),
        [topic],
        handler,
        stop=StopFlag(),
        metrics=TransportMetrics(CollectorRegistry(), "loop"),
        dead_letters=dlq,
        poll_timeout_s=0.2,
    )


def _read_all(bootstrap: str, topic: str, group: str, count: int) -> list[Record]:
    out: list[Record] = []

    def keep(record: Record) -> Disposition:
        out.append(record)
        return Disposition.DONE

    loop, _, _ = make_loop(bootstrap, group, [topic], keep)
    loop.run(max_records=count, idle_timeout_s=20)
    return out


def test_oversized_payloads_and_headers_are_dead_lettered_in_a_form_that_fits(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic, dlq = f"{topic_prefix}.in", f"{topic_prefix}.dlq"
    create_topics(kafka_bootstrap, topic, dlq)
    hostile = _hostile_producer(kafka_bootstrap)
    big_value = bytes(range(256)) * (12 * 1024)  # 3 MiB in one message
    hostile.send_sync(topic, b"k" * 100_000, big_value, [("sapo-node-id", b"peer-x")])
    huge_headers = [(f"h{i}", b"v" * 60_000) for i in range(40)]  # 2.4 MB of headers
    hostile.send_sync(topic, b"headers", b"\x0a\x01x", huge_headers)
    hostile.send_sync(topic, b"fine", b"ok", [])

    def reject_all_but_fine(record: Record) -> Disposition:
        if record.value == b"ok":
            return Disposition.DONE
        raise InvalidMessageError("oversized", f"{len(record.value or b'')} bytes")

    registry = CollectorRegistry()
    metrics = TransportMetrics(registry, "dlq")
    loop_pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap}, metrics, max_message_bytes=LIMIT)
    # The node's own dead letters at the default limit, as `sapo.runtime` wires them.
    letters_out = DeadLetters(loop_pub, dlq, "test", metrics, max_value_bytes=chunk_size(LIMIT))
    loop = _loop(kafka_bootstrap, f"{topic_prefix}.g", topic, reject_all_but_fine, letters_out)
    assert loop.run(max_records=3, idle_timeout_s=20) == 3
    assert loop_pub.flush(10) == 0
    assert registry.get_sample_value("sapo_dlq_messages_dead_lettered_total", {"reason": "oversized"}) == 2
    assert registry.get_sample_value("sapo_dlq_dead_letters_failed_total", {"kind": "too_large"}) == 0

    letters = _read_all(kafka_bootstrap, dlq, f"{topic_prefix}.dlq-reader", 2)
    by_key = {r.key: r for r in letters}
    value_letter = by_key[b"k" * 1024]  # the key cut to a bounded size
    assert value_letter.headers[H_REASON] == b"oversized"
    assert value_letter.value == big_value[: chunk_size(LIMIT)]
    assert value_letter.headers[H_ORIGINAL_BYTES] == str(len(big_value)).encode()
    assert value_letter.headers[H_ORIGINAL_SHA] == hashlib.sha256(big_value).hexdigest().encode()
    assert value_letter.headers["sapo-node-id"] == b"peer-x"
    header_letter = by_key[b"headers"]
    assert header_letter.value == b"\x0a\x01x"
    assert int(header_letter.headers[H_HEADERS_DROPPED]) > 0
    assert sum(len(k) + len(v) for k, v in header_letter.headers.items()) < 64 * 1024


def test_a_dead_letter_the_producer_refuses_is_counted_and_consumption_goes_on(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic, dlq = f"{topic_prefix}.in", f"{topic_prefix}.dlq"
    create_topics(kafka_bootstrap, topic, dlq)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    for value in (b"bad", b"good"):
        pub.send_sync(topic, None, value * 1000, [])
    pub.close()
    handled: list[bytes] = []

    def handle(record: Record) -> Disposition:
        if (record.value or b"").startswith(b"bad"):
            raise InvalidMessageError("undecodable")
        handled.append(record.value or b"")
        return Disposition.DONE

    # A producer whose message limit is below what the dead letter needs: librdkafka refuses it.
    registry = CollectorRegistry()
    metrics = TransportMetrics(registry, "dlq")
    tiny = KafkaPublisher({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": "1000"}, metrics)
    loop = _loop(kafka_bootstrap, f"{topic_prefix}.g", topic, handle, DeadLetters(tiny, dlq, "test", metrics))
    # The logged refusal keeps this frame, and so the client, alive as long as pytest keeps the
    # test's log records (the whole session): closed here, it cannot outlive the broker.
    try:
        handled_before = loop.run(max_records=2, idle_timeout_s=20)
    finally:
        tiny.close()
    assert handled_before == 2
    assert handled == [b"good" * 1000]
    assert registry.get_sample_value("sapo_dlq_dead_letters_failed_total", {"kind": "too_large"}) == 1
    assert registry.get_sample_value("sapo_dlq_produce_errors_total", {"kind": "too_large"}) == 1
    assert (
        registry.get_sample_value("sapo_dlq_messages_dead_lettered_total", {"reason": "undecodable"}) is None
    )


def read_hostile_topic(bootstrap: str, topic: str, dlq: str, group: str, count: int) -> None:
    """Consume `count` records of `topic` and print what was handled and refused, one JSON line (run in
    a child process: a crash of the client must fail the test, not end the test session)."""
    handled: list[str] = []

    def handle(record: Record) -> Disposition:
        handled.append((record.value or b"").decode())
        return Disposition.DONE

    loop, registry, publisher = make_loop(bootstrap, group, [topic], handle, service="probe", dlq_topic=dlq)
    read = loop.run(max_records=count, idle_timeout_s=20)
    rejected = registry.get_sample_value("sapo_probe_messages_rejected_total", {"reason": "bad_header"})
    print(
        json.dumps({"read": read, "handled": handled, "bad_header": rejected, "unsent": publisher.flush(10)})
    )


def test_a_header_name_that_is_not_utf8_is_refused_and_what_follows_is_handled(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """confluent-kafka cannot decode such a name: the record stopped the loop in a traceback or, once
    the interpreter had specialized the call that reads headers (after a few dozen records), a
    segmentation fault, and a restarted service read it again: one message stopped every reader."""
    topic, dlq = f"{topic_prefix}.in", f"{topic_prefix}.dlq"
    create_topics(kafka_bootstrap, topic, dlq)
    before = [f"before-{i}" for i in range(40)]
    publisher = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    for value in before:
        publisher.send(topic, b"k", value.encode(), [("ok", b"1")])
    assert publisher.flush(30) == 0
    produce_raw(kafka_bootstrap, topic, b"k1", b"hostile", [(b"\xff\xfe", b"1"), (b"sapo-node-id", b"x")])
    produce_raw(kafka_bootstrap, topic, b"k2", b"after", [(b"ok", b"2")])
    args = (kafka_bootstrap, topic, dlq, f"{topic_prefix}.g", len(before) + 2)
    child = subprocess.run(
        [sys.executable, "-c", f"from {__name__} import read_hostile_topic as r; r(*{args!r})"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    outcome = json.loads(child.stdout.splitlines()[-1])
    assert outcome == {"read": len(before) + 2, "handled": [*before, "after"], "bad_header": 1, "unsent": 0}
    (dead,) = _read_all(kafka_bootstrap, dlq, f"{topic_prefix}.dlq-reader", 1)
    assert (dead.key, dead.value) == (b"k1", b"hostile")
    assert dead.headers[H_REASON] == b"bad_header"
    assert b"not UTF-8" in dead.headers[H_DETAIL]
