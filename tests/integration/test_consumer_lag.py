"""Consumer lag gauges from a real librdkafka consumer's statistics against the broker: each assigned
partition's unread messages in the service's Prometheus text, gone once the consumer closes."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sapo.kafka import TransportMetrics
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
