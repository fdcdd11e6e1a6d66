"""The sampler's output, a `TrainingBatch`, and what a restarting sampler learns back from its topic.

A batch id is `<node_id>/<sequence>`, sequences count from 0 without gaps, and a batch's target policy
version is its sequence (one batch = one optimizer step). A lock-step batch may hold no group at all
(no group of the round had signal): the trainer takes a no-op step that still advances the version,
so the node's rounds and versions stay aligned with the swarm's.

`History` is folded from the node's own batch topic on start: the next sequence and round, and every
group id already trained on, so a restart neither repeats a batch id nor puts a group in two batches.
The trainer's announcements (the node's policy topic) are folded in too: when the batch topic lost its
history while the checkpoints stayed, they say where the trainer expects the sequence to go on
(`sapo.sampler.core`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from sapo.sampler.screen import Scored
from sapo.v1 import batch_pb2
from sapo.wire import SCHEMA_VERSION

log = logging.getLogger(__name__)

_SOURCE = {"local": batch_pb2.GROUP_SOURCE_LOCAL, "external": batch_pb2.GROUP_SOURCE_EXTERNAL}
Position = tuple[str, int, int]
"""(topic, partition, offset) of one consumed group."""


def batch_id(node_id: str, sequence: int) -> str:
    return f"{node_id}/{sequence}"


def sequence_of(batch_key: str, node_id: str) -> int | None:
    """The sequence in a batch id of this node, or None when the id is not one of ours."""
    prefix, _, number = batch_key.rpartition("/")
    return int(number) if prefix == node_id and number.isdigit() else None


def offset_ranges(positions: Iterable[Position]) -> list[batch_pb2.OffsetRange]:
    """Positions merged into contiguous inclusive ranges per partition (for audit and replay)."""
    ranges: list[batch_pb2.OffsetRange] = []
    for topic, partition, offset in sorted(set(positions)):
        last = ranges[-1] if ranges else None
        if last is not None and (last.topic, last.partition, last.last + 1) == (topic, partition, offset):
            last.last = offset
        else:
            ranges.append(batch_pb2.OffsetRange(topic=topic, partition=partition, first=offset, last=offset))
    return ranges


def build_batch(
    node_id: str,
    sequence: int,
    groups: Sequence[Scored],
    positions: Iterable[Position],
    *,
    round_: int | None,
    created_at: Timestamp,
    warm_start: bool = False,
) -> batch_pb2.TrainingBatch:
    """The batch message: groups in the given order (local first by convention). Refuses a group
    whose rewards are a sender's unverified claims: only this node's own rewards are trained on."""
    unverified = [s.group_id for s in groups if not s.verified]
    if unverified:
        raise ValueError(f"unverified groups {unverified} in batch {batch_id(node_id, sequence)}")
    return batch_pb2.TrainingBatch(
        schema_version=SCHEMA_VERSION,
        batch_id=batch_id(node_id, sequence),
        node_id=node_id,
        sequence=sequence,
        target_policy_version=sequence,
        round=sequence if round_ is None else round_,
        groups=[
            batch_pb2.BatchGroup(
                group=s.group, source=_SOURCE[s.origin], rewards=s.rewards, advantages=s.advantages
            )
            for s in groups
        ],
        offsets=offset_ranges(positions),
        created_at=created_at,
        warm_start=warm_start,
    )


@dataclass(frozen=True)
class History:
    """What the node's batch topic says about the batches already emitted."""

    next_sequence: int = 0
    next_round: int = 0
    used_group_ids: tuple[str, ...] = ()
    batches: int = 0
    trainer_next_sequence: int = 0
    """The lowest sequence the trainer's announcements say it accepts next (0: none read)."""
    trainer_version: int = 0
    """The newest version the trainer announced (0: none read)."""
    warm_batches: int = 0
    """Of `batches`, the warm-start ones (`sapo.sampler.warm`)."""


class HistoryBuilder:
    """Folds batches (any order, duplicates allowed) into a `History`."""

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._next_sequence = 0
        self._next_round = 0
        self._used: dict[str, None] = {}
        self._batches = 0
        self._warm_batches = 0
        self._trainer = (0, 0)

    def add(self, batch: batch_pb2.TrainingBatch) -> None:
        if batch.node_id != self._node_id:
            log.warning("batch %s of node %r in our batch topic: ignored", batch.batch_id, batch.node_id)
            return
        self._batches += 1
        self._warm_batches += batch.warm_start
        self._next_sequence = max(self._next_sequence, batch.sequence + 1)
        self._next_round = max(self._next_round, batch.round + 1)
        for bg in batch.groups:
            self._used[bg.group.group_id] = None

    def trained(self, next_sequence: int, version: int) -> None:
        """The trainer announced `version` and accepts sequences from `next_sequence` on."""
        self._trainer = (max(self._trainer[0], next_sequence), max(self._trainer[1], version))

    def add_undecodable(self, key: bytes | None) -> None:
        """A batch we cannot read still holds its sequence: never reuse it (its groups may be reused;
        a corrupt batch in our own topic is logged loudly)."""
        sequence = sequence_of((key or b"").decode("utf-8", "replace"), self._node_id)
        log.error("undecodable batch with key %r in our batch topic", key)
        if sequence is not None:
            self._next_sequence = max(self._next_sequence, sequence + 1)

    def history(self) -> History:
        return History(
            self._next_sequence,
            self._next_round,
            tuple(self._used),
            self._batches,
            *self._trainer,
            warm_batches=self._warm_batches,
        )
