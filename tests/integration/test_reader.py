"""KafkaReaderClient on the real broker: a reader of its own, in no consumer group."""

from __future__ import annotations

import time

import pytest

from sapo.kafka import KafkaPublisher, KafkaReaderClient, Record
from sapo.kafka.consumer import READER_RETRY_MAX_S
from sapo.kafka.records import TopicPartition
from sapo.settings import ConsumerProfile
from tests.integration.kafka_helpers import create_topics, fill_partitions

pytestmark = pytest.mark.integration


def _reader(bootstrap: str, group: str) -> KafkaReaderClient:
    config = {"bootstrap.servers": bootstrap} | ConsumerProfile.local().to_librdkafka()
    return KafkaReaderClient(config, group)


def _read(client: KafkaReaderClient, count: int, deadline_s: float = 30.0) -> list[Record]:
    out: list[Record] = []
    deadline = time.monotonic() + deadline_s
    while len(out) < count and time.monotonic() < deadline:
        record = client.poll(0.2)
        if record is not None:
            out.append(record)
    return out


def _never(_tps: list[TopicPartition]) -> None:
    raise AssertionError("a reader is never revoked")


def test_a_reader_reads_every_partition_from_the_start_and_joins_no_group(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    topic = f"{topic_prefix}.policy"
    fill_partitions(kafka_bootstrap, topic, [[b"%d/%d" % (p, i) for i in range(2)] for p in range(3)])
    group = f"{topic_prefix}.reader"
    assigned: list[TopicPartition] = []

    def on_assign(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        assigned.extend(tps)
        return {}

    first, second = _reader(kafka_bootstrap, group), _reader(kafka_bootstrap, group)
    try:
        first.subscribe([topic], on_assign, _never, _never)
        assert assigned == [(topic, 0), (topic, 1), (topic, 2)]  # at once: no join, no rebalance
        got = _read(first, 6)
        first.store([(topic, 0, 2)])
        first.commit()  # nothing is committed: the next reader under the same name reads it all again
        second.subscribe([topic], lambda tps: {}, _never, _never)
        again = _read(second, 6)
    finally:
        first.close()
        second.close()
    expected = sorted(b"%d/%d" % (p, i) for p in range(3) for i in range(2))
    assert sorted(r.value or b"" for r in got) == expected
    assert sorted(r.value or b"" for r in again) == expected


def test_a_reader_starts_where_on_assign_says(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.batches"
    create_topics(kafka_bootstrap, topic)
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        pub.send_sync(topic, b"k", b"%d" % i)
    client = _reader(kafka_bootstrap, f"{topic_prefix}.from")
    try:
        client.subscribe([topic], lambda tps: {(topic, 0): 3}, _never, _never)
        got = _read(client, 2)
        assert client.poll(1.0) is None
    finally:
        client.close()
    assert [(r.offset, r.value) for r in got] == [(3, b"3"), (4, b"4")]


def test_a_reader_assigns_a_topic_created_after_it_started(kafka_bootstrap: str, topic_prefix: str) -> None:
    topic = f"{topic_prefix}.leases"
    assigned: list[TopicPartition] = []

    def on_assign(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        assigned.extend(tps)
        return {}

    client = _reader(kafka_bootstrap, f"{topic_prefix}.late")
    try:
        client.subscribe([topic], on_assign, _never, _never)
        assert assigned == []
        create_topics(kafka_bootstrap, topic)
        KafkaPublisher({"bootstrap.servers": kafka_bootstrap}).send_sync(topic, b"k", b"late")
        got = _read(client, 1, deadline_s=30 + READER_RETRY_MAX_S)
    finally:
        client.close()
    assert assigned == [(topic, 0)]
    assert [r.value for r in got] == [b"late"]
