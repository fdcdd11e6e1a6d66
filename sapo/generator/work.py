"""Work items: which question of which round a generator replica samples, and with which policy.

A node's generator replicas share its work through Kafka: the trainer publishes one `WorkItem` per
question of a round on `<prefix>.node.<id>.work` when that round may start, and the replicas consume
the topic as one consumer group, so Kafka's group protocol does assignment, failover and scaling.

Everything an item produces is a pure function of (node, round, position): the question (train stream
position `round * B + position`), the sampling seeds of its L completions (`item_seed`) and the group id
(`group_id`). A replica that dies holding an item leaves its offset uncommitted; the item is delivered
again to another replica and produces a group with the same id, which the sampler keeps once.

When a round may start (`plan_rounds`): lock-step round r needs policy version r exactly, so its items
are published once version r exists and carry min = max = r; an item the swarm has moved past (the
replica already holds a newer version) is obsolete and dropped. Async rounds may run up to `max_ahead`
versions ahead of training: when version v exists, rounds up to v + max_ahead are published, each
needing at least version r - max_ahead.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, Self

from pydantic import BaseModel, Field, model_validator

from sapo.tasks.seeds import stable_hash
from sapo.v1 import work_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp

GROUP_ID_NAMESPACE: Final = uuid.UUID("5b0e6c1f-3f1e-4c55-9a4e-2f8f0c6a3d11")
"""Namespace of the name-based (RFC 4122 v5) group ids."""


class PacingMode(StrEnum):
    LOCKSTEP = "lockstep"
    ASYNC = "async"


def group_id(node_id: str, round_: int, position: int) -> str:
    """The id of the group a node generates for question `position` of round `round_`: a v5 UUID, so
    the same item always yields the same id and ids of different nodes never collide."""
    return str(uuid.uuid5(GROUP_ID_NAMESPACE, f"{node_id}/{round_}/{position}"))


def item_seed(node_seed: int, round_: int, position: int) -> int:
    """The sampling seed of one item; its L completions use `sample_seed(item_seed, j)`."""
    return stable_hash("sampling", node_seed, round_, position) % 2**63


def sample_seed(seed: int, sample: int) -> int:
    """The seed of the `sample`-th completion of an item with seed `seed`."""
    return stable_hash("sample", seed, sample) % 2**63


@dataclass(frozen=True)
class Pacing:
    """How far generation may run ahead of training, and how many rounds a run has (0 = no limit)."""

    mode: PacingMode
    max_ahead: int
    rounds: int

    def __post_init__(self) -> None:
        if self.mode is PacingMode.LOCKSTEP and self.max_ahead:
            raise ValueError("lock-step generation runs exactly 0 versions ahead")

    def version_bounds(self, round_: int) -> tuple[int, int | None]:
        """The (lowest, highest or None) policy version round `round_` may be generated with."""
        if self.mode is PacingMode.LOCKSTEP:
            return round_, round_
        return max(0, round_ - self.max_ahead), None

    def last_round(self, version: int) -> int:
        """The last round that may start once `version` exists.

        Lock-step: round r = batch r, so rounds stop at `rounds - 1`. Async: a batch takes local
        groups as they come, and one can take more than a round's worth (external slots nobody can
        fill are filled from local), so a run's last batches could find every generated round used
        up. Each version below `rounds` therefore lets one more round start, up to `max_ahead` past
        the last trained one: the batch that trains version `rounds` always has a fresh round."""
        if self.mode is PacingMode.LOCKSTEP:
            return min(version, self.rounds - 1) if self.rounds else version
        if self.rounds and version >= self.rounds:
            return -1  # the run's versions are trained (a trainer restarted at the end plans nothing)
        return version + self.max_ahead

    def finished(self, round_: int) -> bool:
        """Whether lock-step round `round_` is past the run (the in-process runner's rounds; an async
        run plans up to `max_ahead` rounds more: `last_round`)."""
        return bool(self.rounds) and round_ >= self.rounds


class PacingSettings(BaseModel):
    """How rounds are paced against training, declared once: the trainer plans rounds with them."""

    round_mode: PacingMode = Field(
        PacingMode.LOCKSTEP,
        description="lockstep: round r is generated with policy version r (the paper). async: generation "
        "runs up to max_ahead versions ahead of training.",
    )
    max_ahead: int = Field(
        1, ge=1, le=1000, description="Staleness bound in versions (round_mode=async only; lockstep is 0)."
    )
    rounds: int = Field(
        0,
        ge=0,
        le=10**9,
        description="Rounds of the run (0 = forever): lock-step plans rounds 0..rounds-1; async plans "
        "rounds while the trainer is below version `rounds`, up to max_ahead past its version, so that the "
        "last batches find fresh local groups. Training is not stopped at a version: the swarm launcher "
        "stops a run once every node trained `rounds` versions.",
    )

    @model_validator(mode="after")
    def _check_pacing(self) -> Self:
        if self.round_mode is PacingMode.LOCKSTEP and "max_ahead" in self.model_fields_set:
            prefix = str(getattr(self, "model_config", {}).get("env_prefix", ""))
            raise ValueError(
                f"max_ahead applies to round_mode=async only (lockstep runs exactly 0 ahead): set "
                f"{prefix}ROUND_MODE=async, or unset {prefix}MAX_AHEAD"
            )
        return self

    def pacing(self) -> Pacing:
        max_ahead = self.max_ahead if self.round_mode is PacingMode.ASYNC else 0
        return Pacing(self.round_mode, max_ahead, self.rounds)


@dataclass(frozen=True)
class Item:
    """A work item as the generator reads it."""

    node_id: str
    round: int
    position: int
    stream_index: int
    min_version: int
    max_version: int | None

    def fate(self, loaded: int) -> Literal["ready", "wait", "obsolete"]:
        """What a replica holding policy version `loaded` does with the item."""
        if loaded < self.min_version:
            return "wait"
        if self.max_version is not None and loaded > self.max_version:
            return "obsolete"
        return "ready"

    def to_proto(self, epoch: int = 0) -> work_pb2.WorkItem:
        item = work_pb2.WorkItem(
            schema_version=SCHEMA_VERSION,
            node_id=self.node_id,
            round=self.round,
            position=self.position,
            stream_index=self.stream_index,
            min_policy_version=self.min_version,
            created_at=now_timestamp(),
            epoch=epoch,
        )
        if self.max_version is not None:
            item.max_policy_version = self.max_version
        return item

    @classmethod
    def from_proto(cls, item: work_pb2.WorkItem) -> Item:
        return cls(
            node_id=item.node_id,
            round=item.round,
            position=item.position,
            stream_index=item.stream_index,
            min_version=item.min_policy_version,
            max_version=item.max_policy_version if item.HasField("max_policy_version") else None,
        )

    @property
    def key(self) -> bytes:
        """The Kafka key: one per item, so compaction or dedupe tools see each item once."""
        return f"{self.round}/{self.position}".encode()


def round_items(node_id: str, round_: int, per_round: int, pacing: Pacing) -> list[Item]:
    """The items of one round: questions 0 .. per_round - 1, stream positions round * per_round + i."""
    low, high = pacing.version_bounds(round_)
    return [Item(node_id, round_, i, round_ * per_round + i, low, high) for i in range(per_round)]


def plan_rounds(version: int, planned: int, pacing: Pacing) -> range:
    """The rounds to publish now that `version` exists, given that every round below `planned` was. A
    (re)starting trainer at version v sets `planned = v`: rounds below v were trained already."""
    return range(planned, pacing.last_round(version) + 1)
