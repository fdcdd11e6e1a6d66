"""The sampler service's warm start: read the swarm topic's retained history, screen it through the
service's own identification and decoding path and `sapo.sampler.warm`, publish the warm batches.

The topic is read from the beginning by a reader in no consumer group (`sapo.kafka.KafkaReaderClient`)
that never commits: the history is read, not consumed, so the node's
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

from sapo.identity import Sender
from sapo.kafka import ConsumerClient, Record
from sapo.kafka.chunks import Reassembler
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag
from sapo.node.metrics import SamplerMetrics
from sapo.node.recovery import read_until_idle
from sapo.sampler import Assembly, Discard, SamplerCore, WarmStart, header_reason
from sapo.sampler.settings import SamplerSettings
from sapo.v1.rollout_pb2 import RolloutGroup
from sapo.wire import InvalidMessageError

log = logging.getLogger(__name__)
Admit = Callable[[RolloutGroup, Sender, float], str | None]
"""Takes a decoded group from its sender at a time: None when taken, else the reason it was not."""
Judge = Callable[[Record, Admit], str | None]
"""The service's path for a swarm record: identify, decode, `Admit`, count per peer; may raise
`InvalidMessageError`."""


def run_warm_start(
    core: SamplerCore[Record],
    warm: WarmStart[Record],
    client: ConsumerClient,
    topic: str,
    settings: SamplerSettings,
    *,
    judge: Judge,
    publish: Callable[[Assembly[Record]], None],
    discarded: Callable[[Discard[Record]], None],
    metrics: SamplerMetrics,
    stop: StopFlag,
    beat: Callable[[], None],
    now_s: float,
) -> bool:
    """Read `topic`'s history up to `now_s` into `warm` (the header prefilter, then `judge`), then
    `publish` the warm batches and tell the core it joined; False when `stop` was set first. A record
    `judge` finds invalid is counted, not dead-lettered: the live stream reads it again and
    dead-letters it then."""

    def on_record(record: Record) -> None:
        metrics.warm_read.inc()
        try:
            reason = (
                "bad_header"
                if record.unreadable
                else header_reason(record.headers, "external", core.screen.cfg)
            )
            if reason is None:
                reason = judge(record, lambda group, sender, now: warm.admit(group, record, now, sender))
        except InvalidMessageError as exc:
            reason = exc.reason
        if reason is not None:
            metrics.warm_rejected.labels(reason).inc()

    log.info("warm start: reading the retained history of %s", topic)
    if not read_swarm_history(
        client,
        topic,
        on_record,
        started_ms=int(now_s * 1000),
        max_bytes=settings.max_payload_bytes,
        idle_s=settings.recovery_idle_s,
        timeout_s=settings.recovery_timeout_s,
        stop=stop,
        beat=beat,
    ):
        return False
    assemblies = warm.plan(core.sequence, core.history.next_round)
    for discard in warm.take_discards():  # evicted or unused: never consumed, nothing to finish
        metrics.warm_rejected.labels(discard.reason).inc()
        discarded(discard)
    for assembly in assemblies:
        publish(assembly)
    log.info(
        "warm start: %d history groups read, %d used in %d batches (sequence %d next; rejected: %s)",
        warm.read,
        sum(len(a.external) for a in assemblies),
        len(assemblies),
        core.sequence,
        dict(warm.rejected.most_common()) or "none",
    )
    core.joined()
    return True


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
        if record.unreadable:  # its headers are lost: never part of a message (`bad_header`)
            on_record(record)
            continue
        message = chunks.add(record)  # a large group arrives in chunks (sapo.kafka.chunks)
        for incomplete in chunks.take_dropped():  # the live stream counts and dead-letters these
            log.warning("warm start: %d chunk(s) lost: %s", len(incomplete.parts), incomplete.reason)
        if message is not None:
            on_record(message)
    return not stop.is_set()
