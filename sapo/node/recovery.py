"""Start-up recovery: what the node's own batch topic says was already emitted, and the node's policy
topic how far its trainer got.

A restarted sampler must continue at the next sequence and must not put a group that is already in a
batch into another one (its input offset may not have been committed before the crash). Both facts
live in the batch topic, so it is read from the beginning by a reader in no consumer group
(`sapo.kafka.KafkaReaderClient`, which commits nothing) until nothing arrived for `idle_s` after the
partitions were assigned. The end is found by idleness, not the high watermark: the embedded broker reports a
wrong one, and on Apache Kafka idleness is equally correct because this sampler is the topic's only
writer and is not writing yet. The policy topic (compacted: the trainer's latest announcement) is read
by the same consumer in the same pass: when the batch topic was re-created while the checkpoints
stayed, the announcement, not the empty batch topic, says which sequence the trainer expects next
(`sapo.sampler.core`). A record whose headers cannot be read (a header name that is not UTF-8) is
what every consumer loop refuses (`bad_header`): a batch counts as undecodable (its sequence is not
used again), an announcement is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from sapo.kafka import ConsumerClient, Record, TransportError
from sapo.kafka.chunks import Reassembler
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag
from sapo.sampler import History, HistoryBuilder, next_sequence_of
from sapo.v1 import batch_pb2, policy_pb2
from sapo.wire import InvalidMessageError, decode, validate_policy_update

log = logging.getLogger(__name__)
POLL_S = 0.2


def read_until_idle(
    client: ConsumerClient,
    topics: list[str],
    *,
    idle_s: float,
    timeout_s: float,
    stop: StopFlag,
    beat: Callable[[], None],
    what: str,
    done: Callable[[list[TopicPartition]], bool] = lambda _assigned: False,
) -> Iterator[Record]:
    """Every record of `topics` from the beginning, until nothing arrived for `idle_s` after the
    partitions were assigned, `done(assigned)` holds, or `stop` is set (the caller checks it); the
    client is closed at the end. Raises TransportError naming `what` when the topics were not
    assigned or not read within `timeout_s`."""
    assigned: list[TopicPartition] = []

    def on_assign(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        assigned.extend(tps)
        return {}

    client.subscribe(topics, on_assign, lambda _tps: None, lambda _tps: None)
    started = last_read = time.monotonic()
    try:
        while not stop.is_set():
            record = client.poll(POLL_S)
            beat()
            now = time.monotonic()
            if now - started > timeout_s:
                raise TransportError(
                    f"{what} from {', '.join(topics)} did not finish within {timeout_s} s (assigned: "
                    f"{assigned}); check that the topics exist (`sapo topics`) or raise "
                    "SAPO_SAMPLER_RECOVERY_TIMEOUT_S"
                )
            if not assigned or record is not None:
                last_read = now
            if assigned and (done(assigned) or (record is None and now - last_read >= idle_s)):
                return
            if record is not None:
                yield record
    finally:
        client.close()


def read_history(
    client: ConsumerClient,
    topic: str,
    node_id: str,
    *,
    max_bytes: int,
    idle_s: float,
    timeout_s: float,
    stop: StopFlag,
    beat: Callable[[], None],
    policy_topic: str | None = None,
) -> History | None:
    """The history of `topic` (and of the trainer's announcements on `policy_topic`); None when `stop`
    was set first (the caller must not consume then). Raises TransportError when the topics were not
    assigned or not read within `timeout_s`."""
    builder = HistoryBuilder(node_id)
    chunks = Reassembler(max_bytes, 2 * max_bytes)
    topics = [topic] if policy_topic is None else [topic, policy_topic]
    records = read_until_idle(
        client, topics, idle_s=idle_s, timeout_s=timeout_s, stop=stop, beat=beat, what="recovery"
    )
    for record in records:
        if record.unreadable:  # refused by the trainer's and the generators' loops (`bad_header`)
            log.warning("record at %s/%d/%d skipped: %s", *record.tp, record.offset, record.unreadable)
            if record.topic == topic:
                builder.add_undecodable(record.key)
            continue
        batch = chunks.add(record)  # a large batch arrives in chunks (sapo.kafka.chunks)
        for incomplete in chunks.take_dropped():
            log.warning(
                "%d chunk(s) of a batch could not be reassembled: %s",
                len(incomplete.parts),
                incomplete.reason,
            )
            builder.add_undecodable(incomplete.parts[0].key)
        if batch is None:
            continue
        if batch.topic == policy_topic:
            _fold_announcement(builder, batch, node_id, max_bytes)
            continue
        try:
            builder.add(decode(batch_pb2.TrainingBatch, batch.value, max_bytes))
        except InvalidMessageError:
            builder.add_undecodable(batch.key)
    if stop.is_set():
        return None
    history = builder.history()
    log.info(
        "recovered %d batches from %s: next sequence %d, next round %d, %d groups "
        "used; the trainer announced v%d, expects sequence %d",
        history.batches,
        ", ".join(topics),
        history.next_sequence,
        history.next_round,
        len(history.used_group_ids),
        history.trainer_version,
        history.trainer_next_sequence,
    )
    return history


def _fold_announcement(builder: HistoryBuilder, record: Record, node_id: str, max_bytes: int) -> None:
    """A valid announcement of this node's trainer moves the history's sequence and round forward."""
    try:
        update = decode(policy_pb2.PolicyUpdate, record.value, max_bytes)
    except InvalidMessageError as exc:
        log.warning("unreadable policy update at %s/%d/%d: %s", *record.tp, record.offset, exc)
        return
    if validate_policy_update(update) is not None or update.node_id != node_id:
        log.warning(
            "policy update at %s/%d/%d ignored: not a valid one of %s", *record.tp, record.offset, node_id
        )
        return
    builder.trained(next_sequence_of(update), update.version)
