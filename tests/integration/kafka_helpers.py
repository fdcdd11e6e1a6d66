"""Small helpers for integration tests against the real broker."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from sapo.kafka import (
    ConsumerLoop,
    DeadLetters,
    Disposition,
    Handler,
    KafkaConsumerClient,
    KafkaPublisher,
    Record,
    TransportMetrics,
)
from sapo.kafka.consumer import Prefilter
from sapo.lifecycle import StopFlag
from sapo.settings import ConsumerProfile
from sapo.topics import TopicSpec, ensure_topics


def create_topics(bootstrap: str, *names: str) -> None:
    ensure_topics({"bootstrap.servers": bootstrap}, [TopicSpec(n) for n in names], timeout_s=30)


def fill_partitions(bootstrap: str, topic: str, values: list[list[bytes]]) -> None:
    """Create `topic` with one partition per entry of `values` and write each entry to its partition."""
    ensure_topics({"bootstrap.servers": bootstrap}, [TopicSpec(topic, partitions=len(values))], timeout_s=30)
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap})
    for partition, part in enumerate(values):
        for value in part:
            publisher.send(topic, b"k", value, partition=partition)
    assert publisher.flush(30) == 0


def consumer(bootstrap: str, group: str, profile: ConsumerProfile | None = None) -> KafkaConsumerClient:
    timing = profile or ConsumerProfile.local()
    return KafkaConsumerClient({"bootstrap.servers": bootstrap} | timing.to_librdkafka(), group)


def make_loop(
    bootstrap: str,
    group: str,
    topics: list[str],
    handler: Handler,
    *,
    service: str = "test",
    dlq_topic: str | None = None,
    prefilter: Prefilter | None = None,
    profile: ConsumerProfile | None = None,
) -> tuple[ConsumerLoop, CollectorRegistry, KafkaPublisher]:
    registry = CollectorRegistry()
    metrics = TransportMetrics(registry, service)
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap}, metrics)
    dead = DeadLetters(publisher, dlq_topic, service, metrics) if dlq_topic else None
    loop = ConsumerLoop(
        consumer(bootstrap, group, profile),
        topics,
        handler,
        stop=StopFlag(),
        metrics=metrics,
        dead_letters=dead,
        prefilter=prefilter,
        poll_timeout_s=0.2,
    )
    return loop, registry, publisher


def read_topic(
    bootstrap: str, topic: str, idle_timeout_s: float = 8.0, profile: ConsumerProfile | None = None
) -> list[Record]:
    """Every record of a topic so far: a fresh consumer group reads it until idle (`idle_timeout_s`
    must cover a few of the profile's fetch waits)."""
    return read_topics(bootstrap, [topic], idle_timeout_s, profile)[topic]


def read_topics(
    bootstrap: str, topics: list[str], idle_timeout_s: float = 8.0, profile: ConsumerProfile | None = None
) -> dict[str, list[Record]]:
    """`read_topic` for several topics in one pass (one group join, one idle wait), by topic."""
    out: dict[str, list[Record]] = {topic: [] for topic in topics}

    def keep(record: Record) -> Disposition:
        out[record.topic].append(record)
        return Disposition.DONE

    group = f"{topics[0]}.check.{time.monotonic_ns()}"
    loop, _, _ = make_loop(bootstrap, group, topics, keep, profile=profile)
    loop.run(idle_timeout_s=idle_timeout_s)
    return out
