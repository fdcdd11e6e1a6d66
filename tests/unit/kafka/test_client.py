"""KafkaConsumerClient's commit: which client errors are events and which are fatal."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from sapo.kafka.consumer import KafkaConsumerClient

pytestmark = pytest.mark.unit


class _Failing:
    """Stands in for librdkafka's handle where the error cannot be produced on demand: `_DESTROY` is
    raised only by a commit racing the handle's own teardown (seen when a generator stopped as its
    broker was killed)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def commit(self, asynchronous: bool) -> None:
        raise KafkaException(KafkaError(self.code))


def _client(code: int) -> KafkaConsumerClient:
    client = KafkaConsumerClient({"bootstrap.servers": "127.0.0.1:9"}, "g")
    client._consumer.close()
    client._consumer = _Failing(code)  # type: ignore[assignment]
    return client


@pytest.mark.parametrize("code", [KafkaError._NO_OFFSET, KafkaError._DESTROY])
def test_nothing_to_commit_and_a_commit_lost_to_teardown_are_not_errors(code: int) -> None:
    _client(code).commit()


def test_other_commit_errors_are_raised() -> None:
    with pytest.raises(KafkaException):
        _client(KafkaError.REBALANCE_IN_PROGRESS).commit()
