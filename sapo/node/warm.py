"""Warm start's read of the swarm topic's retained history (`sapo.sampler.warm` decides what to use).

The topic is read from the beginning by a consumer in a group of its own (no committed offsets:
auto.offset.reset=earliest) that never commits: the history is read, not consumed, so the node's
live swarm consumer later reads the same records again, and the screen's dedupe set and lock-step's
closed rounds keep it from using a group twice.

History ends where warm start began: a record appended at or after `started_ms` is live traffic, not
passed on, and ends its partition. The read is over when every assigned partition reached live
traffic or nothing arrived for `idle_s` (a swarm that is quiet, or partitions nobody writes to); it
never relies on the high watermark, which the embedded broker reports wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sapo.kafka import ConsumerClient, Record
from sapo.kafka.chunks import Reassembler
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag
from sapo.node.recovery import read_until_idle

log = logging.getLogger(__name__)


def read_swarm_history(
    client: ConsumerClient,
    topic: str,
    on_record: Callable[[Record], None],
    *,
    started_ms: int,
    max_bytes: int,
    idle_s: float,
    timeout_s: float,
    stop: StopFlag,
    beat: Callable[[], None],
) -> bool:
    """Hand every (reassembled) record of `topic` appended before `started_ms` to `on_record`; False
    when `stop` was set first. Raises TransportError when the topic was not assigned or not read
    within `timeout_s`."""
    chunks = Reassembler(max_bytes, 2 * max_bytes)
    live: set[TopicPartition] = set()
    records = read_until_idle(
        client,
        [topic],
        idle_s=idle_s,
        timeout_s=timeout_s,
        stop=stop,
        beat=beat,
        what="warm start's read",
        done=lambda assigned: set(assigned) <= live,
    )
    for record in records:
        if record.tp in live:
            continue
        if record.timestamp_ms >= started_ms:
            live.add(record.tp)
            continue
        message = chunks.add(record)  # a large group arrives in chunks (sapo.kafka.chunks)
        for incomplete in chunks.take_dropped():  # the live stream counts and dead-letters these
            log.warning("warm start: %d chunk(s) lost: %s", len(incomplete.parts), incomplete.reason)
        if message is not None:
            on_record(message)
    return not stop.is_set()
