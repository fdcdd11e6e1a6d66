"""Lag per assigned partition from a librdkafka statistics object (shaped as STATISTICS.md documents)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sapo.kafka import TransportMetrics
from sapo.kafka.lag import LagGauge, brokers_up, partition_lags

pytestmark = pytest.mark.unit
INVALID = -1001


def partition(
    desired: bool, hi: int, app: int = INVALID, committed: int = INVALID, lo: int = 0
) -> dict[str, Any]:
    return {
        "desired": desired,
        "hi_offset": hi,
        "lo_offset": lo,
        "app_offset": app,
        "committed_offset": committed,
        "consumer_lag": -1 if committed < 0 else hi - committed,  # librdkafka's: from the commit
    }


def stats(**topics: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "rdkafka#consumer-1",
        "type": "consumer",
        "topics": {t: {"partitions": p} for t, p in topics.items()},
    }


def test_lag_is_the_high_watermark_minus_what_the_service_read() -> None:
    lags = partition_lags(
        stats(
            batches={
                "0": partition(True, hi=10, app=7, committed=3),  # read 7: 3 unread (3 held, not lag)
                "-1": partition(False, hi=INVALID),  # librdkafka's unassigned queue
            },
            rollouts={
                "0": partition(True, hi=12, committed=5),  # nothing read since the assignment
                "1": partition(True, hi=4, lo=1),  # nothing read, nothing committed: all unread
                "2": partition(False, hi=9, app=2),  # no longer assigned
                "3": partition(True, hi=INVALID),  # no fetch answered yet
                "4": partition(True, hi=5, app=8),  # a watermark older than the position
            },
        )
    )
    assert lags == {("batches", 0): 3, ("rollouts", 0): 7, ("rollouts", 1): 3, ("rollouts", 4): 0}


def test_the_gauge_follows_each_report_and_forgets_revoked_partitions() -> None:
    registry = CollectorRegistry()
    gauge = LagGauge(TransportMetrics(registry, "trainer").consumer_lag)

    def text() -> str:
        return generate_latest(registry).decode()

    gauge.on_stats(
        json.dumps(stats(t={"0": partition(True, hi=5, app=1), "1": partition(True, hi=2, app=2)}))
    )
    assert 'sapo_trainer_consumer_lag_messages{partition="0",topic="t"} 4.0' in text()
    assert 'sapo_trainer_consumer_lag_messages{partition="1",topic="t"} 0.0' in text()
    gauge.on_stats(json.dumps(stats(t={"0": partition(True, hi=6, app=6), "1": partition(False, hi=2)})))
    assert 'sapo_trainer_consumer_lag_messages{partition="0",topic="t"} 0.0' in text()
    assert 'partition="1"' not in text()
    gauge.on_stats("{not json")  # logged, nothing changes
    assert 'sapo_trainer_consumer_lag_messages{partition="0",topic="t"} 0.0' in text()
    gauge.clear()
    assert "sapo_trainer_consumer_lag_messages{" not in text()


def test_brokers_up_counts_the_clusters_connected_brokers_not_the_bootstrap_entries() -> None:
    def broker(nodeid: int, state: str) -> dict[str, Any]:
        return {"nodeid": nodeid, "state": state}

    connected = {"127.0.0.1:9092/bootstrap": broker(-1, "UP"), "b1": broker(1, "UP"), "b2": broker(2, "UP")}
    assert brokers_up({"brokers": connected}) == 2
    outage = {"127.0.0.1:9092/bootstrap": broker(-1, "TRY_CONNECT"), "b1": broker(1, "CONNECT")}
    assert brokers_up({"brokers": outage}) == 0
    assert brokers_up({}) == 0


def test_the_brokers_gauge_has_no_series_before_the_first_statistics() -> None:
    """Created at 0 it would read as an outage from the client's start, and for ever with statistics
    off: the series appears with the first statistics."""
    registry = CollectorRegistry()
    transport = TransportMetrics(registry, "sampler")

    def scraped() -> str:
        return generate_latest(registry).decode()

    lag = LagGauge(transport.consumer_lag, transport.brokers_up.client("node"))
    assert "sapo_sampler_kafka_brokers_up{" not in scraped()
    lag.on_stats(json.dumps({"brokers": {"b1": {"nodeid": 1, "state": "UP"}}, "topics": {}}))
    assert 'sapo_sampler_kafka_brokers_up{connection="node"} 1.0' in scraped()


def test_the_brokers_gauge_shows_the_most_any_open_client_of_the_connection_reaches() -> None:
    """A reader needs one broker, a group member three: the series is neither of them by turns, a
    client cut off alone does not read as an outage, and a closed client's count goes with it."""
    registry = CollectorRegistry()
    transport = TransportMetrics(registry, "sampler")

    def up(count: int) -> str:
        return json.dumps({"brokers": {f"b{i}": {"nodeid": i, "state": "UP"} for i in range(count)}})

    def scraped() -> str:
        return generate_latest(registry).decode()

    reader = LagGauge(transport.consumer_lag, transport.brokers_up.client("node"))
    member = LagGauge(transport.consumer_lag, transport.brokers_up.client("node"))
    swarm = LagGauge(transport.consumer_lag, transport.brokers_up.client("swarm"))
    member.on_stats(up(3))
    reader.on_stats(up(1))
    swarm.on_stats(up(2))
    assert 'sapo_sampler_kafka_brokers_up{connection="node"} 3.0' in scraped()
    reader.on_stats(up(0))
    assert 'sapo_sampler_kafka_brokers_up{connection="node"} 3.0' in scraped()
    member.clear()
    assert 'sapo_sampler_kafka_brokers_up{connection="node"} 0.0' in scraped()
    assert 'sapo_sampler_kafka_brokers_up{connection="swarm"} 2.0' in scraped()
    reader.clear()
    assert 'connection="node"' not in scraped()
