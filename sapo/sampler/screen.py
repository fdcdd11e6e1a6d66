"""The sampler's filter pipeline (DESIGN §4): what a node trusts of its own and the swarm's groups.

Steps run cheapest first, so most of a large swarm's traffic is dropped before it costs anything:

1. `header_reason`: routing facts from headers, before decoding (own node on the swarm stream, task
   not accepted, unknown schema version, signature when a swarm key is set).
2. `parse`: bounded decode and structural validation (`InvalidMessageError` -> dead letter).
3. `Screen.check`: identity (the decoded group agrees with the header filters: headers can lie), age
   or staleness, dedupe by group id, re-derivation of question and answer from provenance (a mismatch
   raises `InvalidMessageError` -> dead letter), rewards recomputed by the local verifier (the
   sender's rewards are never read), zero-advantage groups dropped, advantages computed.

Every rejection is a short reason from `REASONS`, safe as a metric label. Malformed and unverifiable
input raises `InvalidMessageError` so the consumer loop dead-letters it; everything else (a stale,
duplicate or signal-free group is a normal event) is returned as a reason and only counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from sapo.convert import question_from_proto
from sapo.grpo.advantages import AdvantageScale, group_advantages, has_signal
from sapo.sampler.seen import SeenGroups
from sapo.sampler.verifier import Verifier
from sapo.tasks import REJECTION_REASONS
from sapo.v1 import rollout_pb2
from sapo.wire import (
    H_NODE,
    H_SCHEMA,
    H_TASK,
    SCHEMA_VERSION,
    InvalidMessageError,
    check_signature,
    decode,
    header_str,
    validate_rollout_group,
)

Origin = Literal["local", "external"]
ORIGINS: Final[tuple[Origin, ...]] = ("local", "external")

HEADER_REASONS: Final = ("own_node", "task_not_accepted", "schema_version", "unsigned", "bad_signature")
MALFORMED_REASONS: Final = (
    # sapo.wire.decode
    "empty_payload",
    "oversized",
    "undecodable",
    "schema_version",
    # sapo.wire.validate_rollout_group
    "bad_group_id",
    "missing_node_id",
    "missing_question",
    "no_completions",
    "missing_finish_reason",
    "logprob_length_mismatch",
    "nonfinite_logprob",
    # sapo.convert.question_from_proto
    "missing_split",
    "bad_metadata_json",
    # sapo.tasks.verify_question: the group is not what its provenance says
    *REJECTION_REASONS,
)
SCREEN_REASONS: Final = (
    "too_old",
    "stale",
    "duplicate",
    "not_train_split",
    "too_few_completions",
    "no_signal",
)
POOL_REASONS: Final = ("late_round", "future_round", "expired", "evicted", "unused")
REASONS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys((*HEADER_REASONS, *MALFORMED_REASONS, *SCREEN_REASONS, *POOL_REASONS))
)
"""Every reason a group can be rejected or discarded for: metric labels are initialised from this."""

MIN_COMPLETIONS: Final = 2
"""A group needs two scored completions for a group-relative advantage to mean anything."""


@dataclass(frozen=True)
class ScreenConfig:
    """What the filters need to know; built from the service settings."""

    node_id: str
    accepted_tasks: frozenset[str] | None  # None: every task verify_question can re-derive
    max_message_bytes: int
    max_external_age_s: float
    max_policy_lag: int
    signing_key: bytes | None
    advantage_scale: AdvantageScale = "std"
    advantage_eps: float = 1e-4


@dataclass(frozen=True)
class Scored:
    """A group that passed every filter, with the receiver's own rewards and advantages.

    `group` holds only the scored completions (ERROR ones removed), so rewards, advantages and
    completions line up one to one as `validate_batch` requires.
    """

    group: rollout_pb2.RolloutGroup
    origin: Origin
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    completed_s: float  # completed_at as epoch seconds; 0.0 when unset

    @property
    def group_id(self) -> str:
        return self.group.group_id

    @property
    def peer(self) -> str:
        return self.group.node_id

    @property
    def round(self) -> int:
        return self.group.round

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)


ArrivalHook = Callable[[rollout_pb2.RolloutGroup, Origin, float], None]


def header_reason(
    headers: Mapping[str, bytes], value: bytes | None, origin: Origin, cfg: ScreenConfig
) -> str | None:
    """Reject on headers alone; a missing header is not a rejection (the decoded body decides).

    The signature is checked on the swarm stream only: it proves a group came from a holder of the
    swarm key, which the node's own private rollout topic does not need.
    """
    if origin == "external" and header_str(headers, H_NODE) == cfg.node_id:
        return "own_node"
    task = header_str(headers, H_TASK)
    if task and cfg.accepted_tasks is not None and task not in cfg.accepted_tasks:
        return "task_not_accepted"
    schema = header_str(headers, H_SCHEMA)
    if schema and schema != str(SCHEMA_VERSION):
        return "schema_version"
    if origin == "external" and cfg.signing_key is not None:
        return check_signature(headers, value or b"", cfg.signing_key)
    return None


def parse(value: bytes | None, max_bytes: int) -> rollout_pb2.RolloutGroup:
    """Decode (size checked first) and validate the structure; raises InvalidMessageError."""
    group = decode(rollout_pb2.RolloutGroup, value, max_bytes)
    problem = validate_rollout_group(group)
    if problem is not None:
        raise InvalidMessageError(problem, f"group {group.group_id!r} from {group.node_id!r}")
    return group


def completed_seconds(group: rollout_pb2.RolloutGroup) -> float:
    ts = group.completed_at
    return ts.seconds + ts.nanos / 1e9


class Screen:
    """Steps 3+ of the pipeline for one node; holds the dedupe set and the verifier caches."""

    def __init__(
        self,
        cfg: ScreenConfig,
        seen: SeenGroups,
        verifier: Verifier | None = None,
        on_arrival: ArrivalHook | None = None,
    ) -> None:
        self.cfg = cfg
        self.seen = seen
        self._verifier = verifier or Verifier()
        self._on_arrival = on_arrival

    def check(
        self, group: rollout_pb2.RolloutGroup, origin: Origin, now_s: float, target_version: int
    ) -> Scored | str:
        """The scored group, or the reason it is not used. Raises InvalidMessageError when the group
        is not what its provenance says (tampered or corrupt: dead-lettered by the loop).

        `on_arrival` sees every group that is genuinely of its node and task, before freshness and
        signal filters: lock-step rounds count a round's groups as arrived even when unusable.
        """
        reason = self._identity_reason(group, origin)
        if reason is not None:
            return reason
        if self._on_arrival is not None:
            self._on_arrival(group, origin, now_s)
        reason = self._freshness_reason(group, origin, now_s, target_version)
        if reason is not None:
            return reason
        if group.group_id in self.seen:
            return "duplicate"
        record = question_from_proto(group.question)
        if record.provenance.split != "train":
            return "not_train_split"
        problem = self._verifier.verify(record)
        if problem is not None:
            raise InvalidMessageError(problem, f"group {group.group_id} from {group.node_id}")
        kept = [c for c in group.completions if c.finish_reason != rollout_pb2.FINISH_REASON_ERROR]
        if len(kept) < MIN_COMPLETIONS:
            return "too_few_completions"
        rewards = self._verifier.rewards(record, [c.text for c in kept])
        if not has_signal(rewards):
            return "no_signal"
        advantages = group_advantages(rewards, self.cfg.advantage_scale, self.cfg.advantage_eps)
        if len(kept) < len(group.completions):
            group = _with_completions(group, kept)
        return Scored(group, origin, tuple(rewards), tuple(advantages), completed_seconds(group))

    def _identity_reason(self, group: rollout_pb2.RolloutGroup, origin: Origin) -> str | None:
        if origin == "external" and group.node_id == self.cfg.node_id:
            return "own_node"
        accepted = self.cfg.accepted_tasks
        if accepted is not None and group.question.task not in accepted:
            return "task_not_accepted"
        return None

    def _freshness_reason(
        self, group: rollout_pb2.RolloutGroup, origin: Origin, now_s: float, target_version: int
    ) -> str | None:
        """External: age since completed_at (unset = infinitely old). Local: policy versions between
        the group's sampling policy and the batch it would join. A peer's policy version says
        nothing about ours, and our own clock-free version count is the better bound locally."""
        if origin == "external":
            completed = completed_seconds(group)
            too_old = completed == 0.0 or now_s - completed > self.cfg.max_external_age_s
            return "too_old" if too_old else None
        lag = target_version - group.policy_version
        return "stale" if lag > self.cfg.max_policy_lag else None


def _with_completions(
    group: rollout_pb2.RolloutGroup, kept: list[rollout_pb2.Completion]
) -> rollout_pb2.RolloutGroup:
    copy = rollout_pb2.RolloutGroup()
    copy.CopyFrom(group)
    del copy.completions[:]
    copy.completions.extend(kept)
    return copy
