"""Watching a service from outside: what it wrote to its topics, and what its consumer groups committed.

Topics are read by explicit assignment from their beginning (`sapo.inspect.reader.TopicReader`): the
kit joins no consumer group, so the service under test never rebalances because of it, and it never
commits. Chunked messages are reassembled as the services' own loops do. A service's committed
offsets are fetched with its group id (`sapo.runtime.consumer_group`) by a client that never
subscribes: an offset fetch, not a group join; the group's state (whether it has a member that finished
joining) is asked of the broker the same way, by describing the group.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Final, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, ConsumerGroupState, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient

from sapo.clientlog import LIBRDKAFKA_LOG
from sapo.inspect.reader import TopicReader
from sapo.kafka import Record
from sapo.kafka.chunks import Reassembler
from sapo.kafka.records import TopicPartition

T = TypeVar("T")
POLL_S: Final = 0.05
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


class Tail:
    """Every message of some topics since their beginning, kept per topic in the order read."""

    def __init__(self, config: Mapping[str, str], topics: Sequence[str], timeout_s: float) -> None:
        self._reader = TopicReader(config, timeout_s=timeout_s)
        tps = self._reader.partitions(topics)
        self._reader.assign(dict.fromkeys(tps, OFFSET_BEGINNING))
        self._reassembler = Reassembler(MAX_MESSAGE_BYTES, 4 * MAX_MESSAGE_BYTES)
        self._records: dict[str, list[Record]] = defaultdict(list)

    def on(self, topic: str) -> list[Record]:
        """The messages of `topic` read so far."""
        return list(self._records[topic])

    def pump(self, seconds: float) -> None:
        """Read whatever arrives for `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._poll()

    def wait(self, found: Callable[[], T | None], timeout_s: float) -> T | None:
        """Read until `found()` returns something other than None or False (returned), or the time
        is up (None)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = found()
            if result is not None and result is not False:
                return result
            if time.monotonic() >= deadline:
                return None
            self._poll()

    def _poll(self) -> None:
        record = self._reader.poll(POLL_S)
        if record is None:
            return
        assembled = self._reassembler.add(record)
        if assembled is not None:
            self._records[assembled.topic].append(assembled)

    def close(self) -> None:
        self._reader.close()


class Committed:
    """The offsets a consumer group committed, fetched without joining it."""

    def __init__(self, config: Mapping[str, str], group: str, timeout_s: float) -> None:
        extra = {
            "group.id": group,
            "enable.auto.commit": "false",
            "client.id": f"sapo-kit-{uuid.uuid4().hex[:6]}",
        }
        self._consumer = Consumer(dict(config) | extra, logger=LIBRDKAFKA_LOG)
        self._timeout_s = timeout_s
        self.group = group

    def offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The committed next offset per partition; -1 where the group committed nothing, or where the
        broker did not answer (`read` tells the two apart)."""
        answered = self.read(tps)
        return dict.fromkeys(tps, -1) if answered is None else answered

    def read(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int] | None:
        """As `offsets`, but None when the broker did not answer."""
        try:
            answers = self._consumer.committed(
                [KafkaTopicPartition(t, p) for t, p in tps], timeout=self._timeout_s
            )
        except KafkaException:
            return None
        return {(a.topic, a.partition): max(a.offset, -1) for a in answers}

    def close(self) -> None:
        self._consumer.close()


def group_state(config: Mapping[str, str], group: str, timeout_s: float) -> ConsumerGroupState | None:
    """The state of a consumer group as the broker describes it (`EMPTY`: no member; `STABLE`: its
    members joined and hold their partitions; the rebalancing states, or `UNKNOWN` on some brokers,
    while one joins); None when the broker does not answer."""
    admin = AdminClient(dict(config), logger=LIBRDKAFKA_LOG)
    try:
        described = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
        state: ConsumerGroupState = described.result(timeout=timeout_s).state
    except (KafkaException, TimeoutError):
        return None
    return state
