"""KafkaConsumerClient's commit: which client errors are events and which are fatal; when a
KafkaReaderClient asks the cluster for its topics' partitions."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from sapo.kafka.consumer import READER_REFRESH_S, READER_RETRY_S, KafkaConsumerClient, KafkaReaderClient

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


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._NO_OFFSET,
        KafkaError._DESTROY,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._WAIT_COORD,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    ],
)
def test_nothing_to_commit_and_a_commit_lost_to_teardown_or_a_loss_are_not_errors(code: int) -> None:
    """_ASSIGNMENT_LOST: a generator's backend call outlasted max.poll.interval.ms, which ended it in a
    traceback once the call's groups were published; the next poll hands the partitions on. The
    group's own answers (a stale generation, a member it dropped, a rebalance under way) mean the
    same and stopped the service too. A coordinator not known (`_WAIT_COORD`, raised by the commit
    of a generator's close as it stopped) leaves the positions stored for the next commit."""
    _client(code).commit()


def test_other_commit_errors_are_raised() -> None:
    with pytest.raises(KafkaException):
        _client(KafkaError.GROUP_AUTHORIZATION_FAILED).commit()


class _Metadata:
    """list_topics' answers, in turn: an exception (the cluster not reached) or the topics it knows."""

    def __init__(self, *answers: Exception | dict[str, list[int]]) -> None:
        self.answers = list(answers)
        self.assigned: list[tuple[str, int, int]] = []

    def list_topics(self, topic: str, timeout: float) -> object:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        known = {name: SimpleNamespace(error=None, partitions=dict.fromkeys(p)) for name, p in answer.items()}
        return SimpleNamespace(topics=known)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += [(p.topic, p.partition, p.offset) for p in partitions]

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p, _ in self.assigned]


def test_a_reader_asks_less_often_for_a_missing_topic_then_refreshes_slowly() -> None:
    now = [0.0]
    reader = KafkaReaderClient({"bootstrap.servers": "127.0.0.1:9"}, "g", clock=lambda: now[0])
    reader._consumer.close()
    unreachable = KafkaException(KafkaError(KafkaError._TRANSPORT))
    metadata = _Metadata(unreachable, {}, unreachable, {"t": [0, 1]}, {"t": [0, 1, 2]})
    reader._consumer = metadata  # type: ignore[assignment]
    checks = []
    reader.subscribe(["t"], lambda tps: {("t", 1): 7}, lambda tps: None, lambda tps: None)
    for _ in range(4):
        checks.append(reader._check_at - now[0])
        now[0] = reader._check_at
        reader._assign_new()  # what poll does once the check is due
    assert checks == [READER_RETRY_S, 2 * READER_RETRY_S, 4 * READER_RETRY_S, READER_REFRESH_S]
    assert metadata.assigned == [("t", 0, OFFSET_BEGINNING), ("t", 1, 7), ("t", 2, OFFSET_BEGINNING)]
    assert reader._check_at - now[0] == READER_REFRESH_S
