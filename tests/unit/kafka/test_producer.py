"""KafkaPublisher's flush: what it reports as not delivered."""

from __future__ import annotations

import socket
import time

import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import DeadLetters, DeliveryError, KafkaPublisher, Record, TransportMetrics
from sapo.lifecycle import StopFlag

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_send_whose_delivery_failed_before_the_flush_is_reported_not_delivered() -> None:
    """A message that failed within the wait (here it timed out: no broker) has left librdkafka's
    queue: a generator flushing its groups took it for delivered and committed the items."""
    bootstrap = f"127.0.0.1:{_closed_port()}"
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap, "message.timeout.ms": "300"})
    try:
        publisher.send("t", b"k", b"v")
        with pytest.raises(DeliveryError):  # its own failure raises here, and is not reported again
            publisher.send_sync("t", b"k", b"w", timeout_s=10.0)
        assert publisher.flush(10.0) == 1
        assert publisher.flush(0.0) == 0  # reported once
    finally:
        publisher.close(timeout_s=0.0)


def test_a_best_effort_send_that_failed_is_counted_but_never_fails_a_flush() -> None:
    """A dead letter goes out best effort on the service's own publisher: had its failure reached the
    next flush, a broken dead-letter topic would stop the generator at every bad record."""
    bootstrap = f"127.0.0.1:{_closed_port()}"
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap, "message.timeout.ms": "300"})
    try:
        metrics = TransportMetrics(CollectorRegistry(), "test")
        DeadLetters(publisher, "dlq", "test", metrics).send(Record("in", 0, 7, b"k", b"bad"), "undecodable")
        assert publisher.flush(10.0) == 0
        assert publisher.errors == 1  # counted all the same
    finally:
        publisher.close(timeout_s=0.0)


def test_a_best_effort_send_still_queued_never_fails_a_flush() -> None:
    """A dead letter not acknowledged within the flush (its topic's leader away) used to count as an
    undelivered group: the generator exited before committing the bad item, met it again on restart,
    and so on."""
    bootstrap = f"127.0.0.1:{_closed_port()}"
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap, "message.timeout.ms": "600000"})
    metrics = TransportMetrics(CollectorRegistry(), "test")
    DeadLetters(publisher, "dlq", "test", metrics).send(Record("in", 0, 7, b"k", b"bad"), "undecodable")
    assert publisher.flush(0.2) == 0
    publisher.send("t", b"k", b"v")
    assert publisher.flush(0.2) == 1  # the group is reported, the dead letter still is not
    assert publisher.close(timeout_s=0.0) == 1  # both dropped: the client is released all the same
    assert publisher.errors == 2


def test_a_message_sent_in_chunks_counts_once_in_what_a_flush_reports() -> None:
    """The flush's count says "N groups unacknowledged": a group in five chunks is one group, whether its
    chunks are still queued or failed."""
    bootstrap = f"127.0.0.1:{_closed_port()}"
    publisher = KafkaPublisher(
        {"bootstrap.servers": bootstrap, "message.timeout.ms": "300"}, max_message_bytes=64 * 1024
    )
    large = bytes(range(256)) * 1024  # 256 KiB: several chunks
    try:
        publisher.send("t", b"k", large)
        publisher.send("t", b"k", b"small")
        assert publisher.flush(0.0) == 2  # still queued
        assert publisher.flush(10.0) == 2  # failed: timed out without a broker
        assert publisher.flush(0.0) == 0  # reported once
    finally:
        publisher.close(timeout_s=0.0)


def test_once_stopping_waits_for_a_broker_that_is_gone_are_bounded_then_skipped() -> None:
    """A sampler stopping with its broker gone waited a third of the lease ttl for the release's
    acknowledgement, then 10 s more in the final flush: past Kubernetes' grace period."""
    bootstrap = f"127.0.0.1:{_closed_port()}"
    stop = StopFlag(broker_wait_s=0.5)
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap}, stop=stop)
    try:
        publisher.send("t", b"k", b"v")
        assert publisher.flush(0.2) == 1  # not stopping: its own timeout
        stop.set("SIGTERM")
        started = time.monotonic()
        with pytest.raises(DeliveryError):
            publisher.send_sync("t", b"k", b"w", timeout_s=30.0)
        assert time.monotonic() - started < 5.0  # the bound (0.5 s), not the 30 s asked for
        started = time.monotonic()
        assert publisher.flush(30.0) == 1  # the broker did not answer: no wait at all now
        assert time.monotonic() - started < 1.0
    finally:
        publisher.close(timeout_s=0.0)
