"""librdkafka's lines and errors through Python logging: once per kind and interval, an unreachable
cluster as one error naming the setting, and a send that a stop cuts short."""

from __future__ import annotations

import logging
import re
import socket
import time

import pytest
from confluent_kafka import KafkaError

from sapo.clientlog import LIBRDKAFKA_LOG, ClientErrors, RepeatFilter, line_kind
from sapo.kafka import DeliveryError, KafkaPublisher

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord(
        "sapo.librdkafka", logging.ERROR, __file__, 1, "%s [%s] %s", ("FAIL", "p-1", text), None
    )


def test_lines_of_one_kind_pass_once_per_interval_and_say_how_many_were_held() -> None:
    clock = _Clock()
    repeat = RepeatFilter(interval_s=60.0, clock=clock)
    refused = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed (after {}ms in state CONNECT)"
    passed = []
    for step in range(25):  # a line every 5 s for two minutes, its timing different each time
        clock.now = step * 5.0
        record = _record(refused.format(step))
        if repeat.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 3  # at 0, 60 and 120 s
    assert passed[0].endswith("(after 0ms in state CONNECT)")
    assert passed[1].endswith("(11 more like it in the last 60 s)")
    other = _record("another kind of line")
    assert repeat.filter(other) and other.getMessage().endswith("another kind of line")


def test_line_kinds_ignore_numbers_only() -> None:
    assert line_kind("after 0ms, broker 1") == line_kind("after 37ms, broker 2")
    assert line_kind("Connection refused") != line_kind("Name resolution failure")


def test_an_unreachable_cluster_is_one_error_naming_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    logged: dict[tuple[str, int], float] = {}
    errors = ClientErrors("kafka:9092", "SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS", clock=clock, logged=logged)
    other_client = ClientErrors(
        "kafka:9092", "SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS", clock=clock, logged=logged
    )
    down = KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")
    with caplog.at_level(logging.WARNING, logger="sapo.clientlog"):
        for step in range(10):
            clock.now = step * 10.0
            errors(down)
            other_client(down)  # the same cluster: the same line, not twice
            errors(KafkaError(KafkaError._TRANSPORT, "Connection refused"))  # librdkafka logs it itself
        errors(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"))
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(messages) == 3  # at 0 and 60 s, and the other error once
    level, text = messages[0]
    assert level == "ERROR" and "kafka:9092" in text and "SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS" in text
    assert messages[2][0] == "WARNING" and "_MSG_TIMED_OUT" in messages[2][1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_real_client_out_of_reach_logs_through_python_logging_and_a_stop_ends_its_wait(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh filter: the process's one has seen refused connects of earlier tests (ports differ only
    # in numbers, so they are the same kind of line) and would hold these back; and the logger's own
    # level, which the `sapo` CLI run in this process by an earlier test raised (its commands quiet it).
    monkeypatch.setattr(LIBRDKAFKA_LOG, "filters", [RepeatFilter()])
    bootstrap = f"127.0.0.1:{_closed_port()}"
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap}, setting="SAPO_X_KAFKA__BOOTSTRAP_SERVERS")
    started = time.monotonic()
    with (
        caplog.at_level(logging.INFO),
        caplog.at_level(logging.INFO, logger=LIBRDKAFKA_LOG.name),
        pytest.raises(DeliveryError, match="stopped waiting"),
    ):
        publisher.send_sync("t", b"k", b"v", timeout_s=600.0, cancel=lambda: time.monotonic() - started > 3.0)
    publisher.close(timeout_s=0.0)
    refused = [r for r in caplog.records if r.name == LIBRDKAFKA_LOG.name]
    assert refused and all(bootstrap in r.getMessage() for r in refused)
    named = [r.getMessage() for r in caplog.records if r.name == "sapo.clientlog"]
    # librdkafka's own count in the middle varies with timing ("1/1", once "0/2" in CI).
    expected = (
        rf"no Kafka broker reachable at {re.escape(bootstrap)} \(\d+/\d+ brokers are down\): check "
        "SAPO_X_KAFKA__BOOTSTRAP_SERVERS and that the brokers are up and listening there; retrying"
    )
    assert len(named) == 1 and re.fullmatch(expected, named[0]), named
