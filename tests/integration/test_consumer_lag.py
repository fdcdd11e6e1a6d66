"""Consumer lag gauges from a real librdkafka consumer's statistics against the broker: each assigned
partition's unread messages in the service's Prometheus text, gone once the consumer closes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sapo.broker import EmbeddedBroker
from sapo.kafka import TransportMetrics
from sapo.kafka.consumer import KafkaReaderClient
from sapo.kafka.lag import LagGauge
from sapo.settings import ConsumerProfile
from tests.integration.kafka_helpers import fill_partitions

pytestmark = pytest.mark.integration


def lag_samples(registry: CollectorRegistry) -> dict[tuple[str, int], float]:
    """The lag gauge's samples, parsed back from the exposition text a scrape reads."""
    text = generate_latest(registry).decode()
    return {
        (s.labels["topic"], int(s.labels["partition"])): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "sapo_sampler_consumer_lag_messages"
        for s in family.samples
    }


def test_lag_gauge_counts_each_assigned_partitions_unread_messages(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.rollouts"
    fill_partitions(kafka_bootstrap, topic, [[b"%d" % i for i in range(10)], [b"%d" % i for i in range(3)]])

    registry = CollectorRegistry()
    gauge = LagGauge(TransportMetrics(registry, "sampler").consumer_lag)
    profile = ConsumerProfile.local().model_copy(update={"statistics_interval_ms": 200})
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic_prefix}.lag"}
        | profile.to_librdkafka()
        | {"stats_cb": gauge.on_stats}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
        read = {0: 0, 1: 0}
        deadline = time.monotonic() + 30
        while sum(read.values()) < 6 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                read[msg.partition() or 0] = (msg.offset() or 0) + 1
        assert sum(read.values()) == 6, read
        consumer.pause(consumer.assignment())  # no more messages; polls still serve the statistics
        expected = {(topic, 0): 10.0 - read[0], (topic, 1): 3.0 - read[1]}
        deadline = time.monotonic() + 10
        while lag_samples(registry) != expected and time.monotonic() < deadline:
            assert consumer.poll(0.1) is None
        assert lag_samples(registry) == expected
    finally:
        consumer.close()
        gauge.clear()
    assert lag_samples(registry) == {}


def brokers_up(registry: CollectorRegistry) -> float | None:
    """The brokers gauge of the node's connection, as a scrape reads it (None: not set yet)."""
    text = generate_latest(registry).decode()
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "sapo_sampler_kafka_brokers_up"
        for s in family.samples
        if s.labels["connection"] == "node"
    ]
    return values[0] if values else None


@pytest.mark.faults
def test_brokers_up_falls_to_zero_while_the_broker_is_down_and_rises_when_it_is_back(
    topic_prefix: str, tmp_path: Path
) -> None:
    """A broker killed with -9 and started again on its port: the gauge says so, where the lag gauges
    only keep their last values and librdkafka only logs."""
    registry = CollectorRegistry()
    transport = TransportMetrics(registry, "sampler")
    profile = ConsumerProfile.local().model_copy(update={"statistics_interval_ms": 200})
    broker = EmbeddedBroker(log_path=tmp_path / "broker.log").start()
    client = KafkaReaderClient(
        {"bootstrap.servers": broker.bootstrap} | profile.to_librdkafka(),
        f"{topic_prefix}.reader",
        lag=transport.consumer_lag,
        brokers_up=transport.brokers_up.client("node"),
    )
    fill_partitions(broker.bootstrap, f"{topic_prefix}.leases", [[b"x"]])

    def polled_until(value: float, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while brokers_up(registry) != value and time.monotonic() < deadline:
            client.poll(0.1)
        return brokers_up(registry)

    try:
        client.subscribe([f"{topic_prefix}.leases"], lambda tps: {}, lambda tps: None, lambda tps: None)
        assert polled_until(1.0, 30) == 1.0
        broker.kill()
        assert polled_until(0.0, 30) == 0.0
        broker.start()
        assert polled_until(1.0, 60) == 1.0
    finally:
        client.close()
        broker.stop()
