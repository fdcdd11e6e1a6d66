"""The sampler's filter pipeline: what a node trusts of its own and the swarm's groups.

Steps run cheapest first, so most of a large swarm's traffic is dropped before it costs anything:

1. `header_reason`: routing facts from headers, before decoding (own node on the swarm stream, task
   not accepted, unknown schema version). Then, still before decoding, who sent it
   (`sapo.sampler.sender`: the signature verified against the node's trust list, `sapo.identity`).
2. `parse`: bounded decode and structural validation, including that the body agrees with the
   routing and facts headers (`InvalidMessageError` -> dead letter). Lazy mode skips this step on
   arrival for swarm records with a facts header (see below).
3. `Screen.check`: identity (the decoded group is the verified sender's, of an accepted task and of
   a dataset configuration the node accepts, by provenance digest: a peer cannot make the node
   re-derive enormous or unknown datasets; only then does lock-step count it as arrived), age (and
   a completion date no further ahead of this node's clock than the skew it tolerates) or
   staleness, dedupe by group id, the split claimed in provenance, then `Screen.verify`:
   re-derivation of question and answer from provenance (a mismatch raises `InvalidMessageError` ->
   dead letter), rewards recomputed by the local verifier (the sender's rewards never reach a
   batch), zero-advantage groups dropped, advantages computed.

The public reference kept a node's own zero-advantage groups in its batches and filtered only the
swarm's (`keep_local_zero_advantage`, setting `SAPO_SAMPLER_KEEP_LOCAL_ZERO_ADVANTAGE`; off by
default). Such a group trains nothing (all advantages 0) but its tokens count in the token-mean
normalizer, which scales the step's gradient down (Adam's per-parameter normalisation largely undoes a
factor shared by the whole step), and its rewards count in the batch mean reward, the paper's metric.
The switch exists to measure that baseline against ours, not to be used: with it, lock-step draws I
local groups from all the round's own groups, and the adaptive mix counts them as signal.

When step 3's verification runs (`VerifyMode`, setting `SAPO_SAMPLER_VERIFY`):
- `eager` (default): on arrival, for every group. Re-derivation and re-scoring cost 0.2-0.9 ms per
  group against tens of microseconds to consume one, so a node reading a large swarm spends most of
  its time verifying groups it will never train on (a batch takes J of the thousands a round brings).
- `lazy`: external groups are verified only when the selection picks them (`Assembler`). On arrival
  they pass the cheap filters and one more: the sender's *claimed* rewards (the completions'
  `reward` fields; unset reads 0) must have signal ("no_signal_claimed"), standing in for the
  recomputed-signal filter. A picked group that fails verification, or whose recomputed rewards
  have no signal, is rejected with its usual reason (dead-lettered where eager would) and the next
  one in the selection's order takes its place.

  Why this draws what eager draws, for uniform selection and honest senders: honest claims (scored
  by the same verifier) equal the recomputed rewards, so the pool holds the groups eager would pool
  plus the dishonest ones. The selection shuffles the pool and walks it, skipping rejected groups;
  the honest groups of a uniform shuffle are a uniform shuffle of the honest groups, so the picks
  (and which ones the per-peer quota lets in) have eager's distribution, and with no dishonest
  group in the pool they are the very same picks. The trade-off: a sender that under-reports
  (claims no signal) only loses its own groups; one that over-claims costs one verification per
  pick and is rejected then; bad groups that are never picked take pool space until they leave as
  expired, evicted or unused, never verified nor dead-lettered.
  Local groups are always verified on arrival (a node's own are few, and lock-step counts them).

  Arrival without decoding (`arrival_facts`, `Screen.check_facts`): a swarm group whose record carries
  the facts header (`sapo.wire.GroupFacts`: id, round, completed_at, config digest, split, scored
  completions, claimed signal; written by every generator since it exists) is screened and pooled
  on the headers alone; its body is kept as bytes and decoded, validated and checked against the
  headers (`facts_mismatch`, dead-lettered as any header/body mismatch) only when the selection
  picks it, right before re-derivation and re-scoring. The filters are the same, in the same order,
  so an honest record gets the verdict its decoded body would get. A record without the header (an
  older sender) is decoded on arrival as above. What a lying header can do is what a lying reward
  claim can: take its sender's own pool share and one verification per pick. It cannot speak for
  another node: the pool keys on the sender (`sapo.sampler.sender`), whose signature, with identity
  on, is verified on arrival over the node header, the payload and (the v2 signature) the facts,
  before the group may take or free any place in the pool, so a forged identity never evicts anyone's
  group; facts no signature covers are set aside and the body decoded (`sapo.identity.signing`). That
  check (~0.1 ms of Ed25519 per record on a 2-core machine) is then most of an arrival's cost.
  Deferring it to the groups the pool would admit is possible (a refusal changes nothing, and
  fairness refuses on the claimed identity's count alone) but not done: lock-step arrivals, per-peer
  accounting and first-use pinning would then see identities nobody verified.

Every rejection is a short reason from `REASONS`, safe as a metric label. Malformed and unverifiable
input raises `InvalidMessageError` so the consumer loop dead-letters it; everything else (a stale,
duplicate or signal-free group is a normal event) is returned as a reason and only counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal, NamedTuple

from sapo.convert import question_from_proto
from sapo.grpo.advantages import SIGNAL_TOLERANCE, AdvantageScale, group_advantages, has_signal
from sapo.identity.trust import IDENTITY_REASONS, Sender
from sapo.sampler.seen import SeenGroups
from sapo.sampler.verifier import Verifier
from sapo.tasks import REJECTION_REASONS
from sapo.v1 import question_pb2, rollout_pb2
from sapo.wire import (
    DECODE_REASONS,
    GROUP_REASONS,
    H_NODE,
    H_SCHEMA,
    H_TASK,
    MAX_GROUP_COMPLETIONS,
    SCHEMA_VERSION,
    GroupFacts,
    InvalidMessageError,
    decode,
    facts_problem,
    group_facts,
    header_str,
    read_facts,
    validate_rollout_group,
)

Origin = Literal["local", "external"]
ORIGINS: Final[tuple[Origin, ...]] = ("local", "external")

HEADER_REASONS: Final = ("own_node", "task_not_accepted", "schema_version")
MALFORMED_REASONS: Final = (
    *DECODE_REASONS,
    # parse: the body says another task than the (signed) routing headers
    "header_mismatch",
    # parse and the facts arrival path: the sapo-group-facts header is malformed or says other than
    # the body (sapo.wire.GroupFacts)
    "facts_mismatch",
    *GROUP_REASONS,
    # sapo.convert.question_from_proto
    "missing_split",
    "bad_metadata_json",
    # sapo.tasks.verify_question: the group is not what its provenance says
    *REJECTION_REASONS,
)
SCREEN_REASONS: Final = (
    "config_not_accepted",
    "too_old",
    "clock_ahead",
    "stale",
    "duplicate",
    "not_train_split",
    "too_few_completions",
    "no_signal",
    "no_signal_claimed",
)
POOL_REASONS: Final = ("late_round", "future_round", "pool_full", "expired", "evicted", "unused")
REASONS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys((*HEADER_REASONS, *IDENTITY_REASONS, *MALFORMED_REASONS, *SCREEN_REASONS, *POOL_REASONS))
)
"""Every reason a group can be rejected or discarded for: metric labels are initialised from this."""

MIN_COMPLETIONS: Final = 2
"""A group needs two scored completions for a group-relative advantage to mean anything."""
_ERROR: Final = rollout_pb2.FINISH_REASON_ERROR
_SCHEMA: Final = str(SCHEMA_VERSION).encode()
"""The schema header of the one version this code reads (a header is compared undecoded)."""


class VerifyMode(StrEnum):
    """When external groups are re-derived and re-scored; see the module docstring."""

    EAGER = "eager"
    LAZY = "lazy"


@dataclass(frozen=True)
class ScreenConfig:
    """What the filters need to know; built by `SamplerSettings.screen_config`, which declares every value."""

    node_id: str
    accepted_tasks: frozenset[str] | None  # None: every task verify_question can re-derive
    accepted_configs: frozenset[str]  # config digests a peer's provenance may name
    max_payload_bytes: int
    max_external_age_s: float
    max_clock_skew_s: float
    max_policy_lag: int
    advantage_scale: AdvantageScale
    advantage_eps: float
    verify: VerifyMode
    dedupe_capacity: int
    keep_local_zero_advantage: bool


class Scored(NamedTuple):
    """A group that passed the filters, with its rewards and advantages.

    `group` holds only the scored completions (ERROR ones removed), so rewards, advantages and
    completions line up one to one as `validate_batch` requires. `verified` says whose rewards these
    are: True, the receiver's own (re-derived and re-scored), the only kind a batch may hold; False
    (lazy mode, external groups), the sender's claims with no advantages yet, until `Screen.verify`
    replaces them when the selection picks the group.

    A named tuple, not a frozen dataclass: a sampler builds one per record that passes screening (most
    of a large swarm's arrivals), at a quarter of the cost.
    """

    group: rollout_pb2.RolloutGroup
    origin: Origin
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    completed_s: float  # completed_at as epoch seconds; 0.0 when unset
    verified: bool = True
    unread: Unread | None = None
    """Set when the group was screened on its facts header alone (`Screen.check_facts`): `group` then
    holds only the id, node and round those headers state, and `Screen.verify` decodes this body."""

    @property
    def group_id(self) -> str:
        return self.group.group_id

    @property
    def peer(self) -> str:
        """The sending node: `Screen.check` admits only groups that name their verified sender, so
        per-peer quotas count verified identities."""
        return self.group.node_id

    @property
    def round(self) -> int:
        return self.group.round

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)


class Unread(NamedTuple):
    """The undecoded body of a group pooled on its headers, the headers it came with and the facts
    it was screened on. The service's handle (the consumed record) holds the same bytes, so pooling
    them costs no copy. A named tuple: one is built per record a lazy sampler reads."""

    value: bytes
    headers: Mapping[str, bytes]
    facts: GroupFacts


ArrivalHook = Callable[[str, str, int, Origin, float], None]
"""Called with (node id, group id, round, origin, now_s) of a group genuinely of its node (`Screen.check`)."""


def header_reason(headers: Mapping[str, bytes], origin: Origin, cfg: ScreenConfig) -> str | None:
    """Reject on headers alone; a missing header is not a rejection (the decoded body decides).

    These are the cheapest filters, run on claims nobody verified yet: a lying header only loses its
    own group here, and what a group is allowed to count for is decided after verification.
    """
    # Runs on every record read: only what a verdict needs is decoded (the task only when one can be
    # refused; the schema version compared as the bytes its one accepted value encodes to).
    if origin == "external":
        if header_str(headers, H_NODE) == cfg.node_id:
            return "own_node"
        # The node's own groups of a task it does not train on still complete its lock-step round, so
        # they are decoded and refused by `Screen.check` after the round counted them.
        accepted = cfg.accepted_tasks
        if accepted is not None and (task := header_str(headers, H_TASK)) and task not in accepted:
            return "task_not_accepted"
    schema = headers.get(H_SCHEMA)
    if schema and schema != _SCHEMA:
        return "schema_version"
    return None


def arrival_facts(headers: Mapping[str, bytes], origin: Origin, cfg: ScreenConfig) -> GroupFacts | None:
    """The facts to screen a swarm group on without decoding it (`Screen.check_facts`): lazy mode and
    a facts header present; None when the group must be decoded on arrival (eager mode, the node's own
    groups, a sender that does not write the header). Raises InvalidMessageError when it is malformed."""
    if cfg.verify is not VerifyMode.LAZY or origin != "external":
        return None
    return read_facts(headers)


def parse(
    value: bytes | None, max_bytes: int, headers: Mapping[str, bytes] | None = None
) -> rollout_pb2.RolloutGroup:
    """Decode (size checked first) and validate the structure, and that the body says what the
    headers said (the task a filter trusted, the facts a lazy sampler pooled it on); raises
    InvalidMessageError."""
    group = decode(rollout_pb2.RolloutGroup, value, max_bytes)
    problem = validate_rollout_group(group)
    if problem is None and headers is not None:
        task = header_str(headers, H_TASK)
        problem = "header_mismatch" if task and task != group.question.task else facts_problem(group, headers)
    if problem is not None:
        raise InvalidMessageError(problem, f"group {group.group_id!r} from {group.node_id!r}")
    return group


def completed_seconds(group: rollout_pb2.RolloutGroup) -> float:
    ts = group.completed_at
    return ts.seconds + ts.nanos / 1e9


def unread_scored(unread: Unread, node: str) -> Scored:
    """The unverified pooled form of a group `Screen.facts_reason` passed: a stand-in group with the
    id, node and round its headers state, and the undecoded body for `Screen.verify`."""
    facts = unread.facts
    group = rollout_pb2.RolloutGroup(group_id=facts.group_id, node_id=node, round=facts.round)
    # tuple.__new__ skips the named tuple's Python-level __new__: one per group a lazy sampler pools.
    return tuple.__new__(Scored, (group, "external", (), (), facts.completed_s, False, unread))


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

    def sibling(self, cfg: ScreenConfig, on_arrival: ArrivalHook | None) -> Screen:
        """A screen with other bounds sharing this one's dedupe set and verifier caches (warm start
        screens history with its own age bound: `sapo.sampler.warm`)."""
        return Screen(cfg, self.seen, self._verifier, on_arrival)

    def check(
        self,
        group: rollout_pb2.RolloutGroup,
        origin: Origin,
        now_s: float,
        target_version: int,
        sender: Sender,
    ) -> Scored | str:
        """The scored group (unverified for an external group in lazy mode), or the reason it is not
        used. Raises InvalidMessageError when the group is malformed, not its sender's
        ("identity_mismatch") or not what its provenance says (dead-lettered by the loop).

        `sender` is who sent it as far as the receiver can tell (`sapo.sampler.sender`); the group
        must name that node, so per-peer quotas and lock-step arrival, which read `group.node_id`,
        key on the verified identity. `on_arrival` sees every group that is genuinely of its node
        and, for peers, of an accepted task, before freshness and signal filters: lock-step rounds
        count a round's groups as arrived even when unusable. The node's own groups count whatever
        their task, so a node that trains on only some of its tasks still closes its rounds.
        """
        if sender.node_id and group.node_id != sender.node_id:
            raise InvalidMessageError(
                "identity_mismatch", f"group {group.group_id} names {group.node_id!r}, sent by {sender}"
            )
        reason = self._identity_reason(group, origin)
        if reason is not None and origin == "external":  # as the header prefilter: never an arrival
            return reason
        if self._on_arrival is not None:  # an own group of a refused task still completes the round
            self._on_arrival(group.node_id, group.group_id, group.round, origin, now_s)
        if reason is not None:
            return reason
        reason = self._freshness_reason(group, origin, now_s, target_version)
        if reason is not None:
            return reason
        if group.group_id in self.seen:
            return "duplicate"
        reason = _split_reason(group.question.provenance.split, group.group_id, group.node_id)
        if reason is not None:
            return reason
        kept = [c for c in group.completions if c.finish_reason != _ERROR]
        if self.cfg.verify is VerifyMode.EAGER or origin == "local":
            return self._score(group, kept, origin)
        if len(kept) < MIN_COMPLETIONS:
            return "too_few_completions"
        claimed = [c.reward for c in kept]
        if not _claims_signal(claimed):
            return "no_signal_claimed"
        group = _with_completions(group, kept) if len(kept) < len(group.completions) else group
        return Scored(group, origin, tuple(claimed), (), completed_seconds(group), verified=False)

    def check_facts(self, unread: Unread, now_s: float, sender: Sender) -> Scored | str:
        """`check` of a lazily screened swarm group, on its facts header instead of its body
        (`arrival_facts`): the same filters in the same order (`facts_reason`), and an unverified
        `Scored` that holds the undecoded body (`unread_scored`). `sender` must name the node
        (identity verified the signature over the node header, or with identity off the header is
        all there is). Whether the body says what the facts say is checked when `verify` decodes it: a
        lie costs the liar's own pool share until then, and is dead-lettered then ("facts_mismatch")."""
        reason = self.facts_reason(unread, now_s, sender.node_id)
        return reason if reason is not None else unread_scored(unread, sender.node_id)

    def facts_reason(self, unread: Unread, now_s: float, node: str) -> str | None:
        """The reason `check_facts` refuses a group sent by `node`, or None when it passes. Builds
        nothing: most of a large swarm's arrivals are refused here or by the pool, and the caller
        builds the pooled form (`unread_scored`) only for a group the pool takes."""
        value, headers, facts = unread
        if len(value) > self.cfg.max_payload_bytes:  # as `decode` would: the pool holds the bytes
            raise InvalidMessageError("oversized", f"{len(value)} bytes > {self.cfg.max_payload_bytes}")
        if facts.scored > MAX_GROUP_COMPLETIONS:  # as `parse` would: the facts restate the body
            raise InvalidMessageError("too_many_completions", f"{facts.scored} > {MAX_GROUP_COMPLETIONS}")
        accepted = self.cfg.accepted_tasks  # the task header is only read when a task can be refused
        task = header_str(headers, H_TASK) if accepted is not None else ""
        reason = self._identity_reason_of(node, task, facts.config_digest, "external")
        if reason is not None:
            return reason
        if self._on_arrival is not None:
            self._on_arrival(node, facts.group_id, facts.round, "external", now_s)
        reason = self._age_reason(facts.completed_s, now_s)
        if reason is not None:
            return reason
        if facts.group_id in self.seen:
            return "duplicate"
        reason = _split_reason(facts.split, facts.group_id, node)
        if reason is not None:
            return reason
        if facts.scored < MIN_COMPLETIONS:
            return "too_few_completions"
        return None if facts.signal else "no_signal_claimed"

    def verify(self, scored: Scored) -> Scored | str:
        """The verified form of a group `check` or `check_facts` passed unverified, or the reason it
        is not used ("too_few_completions", "no_signal"); raises InvalidMessageError when the group
        is malformed, not what its headers or its provenance say. A verified group is returned as it is."""
        if scored.verified:
            return scored
        if scored.unread is None:
            return self._score(scored.group, list(scored.group.completions), scored.origin)
        group = self._decoded(scored, scored.unread)
        kept = [c for c in group.completions if c.finish_reason != _ERROR]
        return self._score(group, kept, scored.origin)

    def _decoded(self, scored: Scored, unread: Unread) -> rollout_pb2.RolloutGroup:
        """The body of a group pooled on its facts: decoded, validated, and the group its headers
        described (same facts, same node as the sender it was pooled for)."""
        group = parse(unread.value, self.cfg.max_payload_bytes, unread.headers)
        if group.node_id != scored.peer:
            raise InvalidMessageError(
                "identity_mismatch",
                f"group {group.group_id} names {group.node_id!r}, sent by {scored.peer!r}",
            )
        if group_facts(group) != unread.facts:  # `parse` compared the header too; this is what was pooled
            raise InvalidMessageError("facts_mismatch", f"group {group.group_id} from {group.node_id}")
        return group

    def _score(
        self, group: rollout_pb2.RolloutGroup, kept: list[rollout_pb2.Completion], origin: Origin
    ) -> Scored | str:
        """Re-derivation from provenance, then this node's rewards of the `kept` completions."""
        record = question_from_proto(group.question)
        problem = self._verifier.verify(record)
        if problem is not None:
            raise InvalidMessageError(problem, f"group {group.group_id} from {group.node_id}")
        if len(kept) < MIN_COMPLETIONS:
            return "too_few_completions"
        rewards = self._verifier.rewards(record, [c.text for c in kept])
        if not has_signal(rewards) and not (origin == "local" and self.cfg.keep_local_zero_advantage):
            return "no_signal"
        advantages = group_advantages(rewards, self.cfg.advantage_scale, self.cfg.advantage_eps)
        if len(kept) < len(group.completions):
            group = _with_completions(group, kept)
        return Scored(group, origin, tuple(rewards), tuple(advantages), completed_seconds(group))

    def _identity_reason(self, group: rollout_pb2.RolloutGroup, origin: Origin) -> str | None:
        question = group.question
        return self._identity_reason_of(
            group.node_id, question.task, question.provenance.config_digest, origin
        )

    def _identity_reason_of(self, node: str, task: str, config_digest: str, origin: Origin) -> str | None:
        if origin == "external" and node == self.cfg.node_id:
            return "own_node"
        accepted = self.cfg.accepted_tasks
        if accepted is not None and task not in accepted:
            return "task_not_accepted"
        if origin == "external" and config_digest not in self.cfg.accepted_configs:
            return "config_not_accepted"  # before any re-derivation: its cost stays bounded by our configs
        return None

    def _age_reason(self, completed_s: float, now_s: float) -> str | None:
        """A swarm group's age since completed_at (unset = infinitely old) is over the bound, or its
        completed_at lies further ahead of this node's clock than the skew it tolerates: such a group
        would stay fresh, in the pool and for replays, for as long as its date is ahead."""
        if completed_s == 0.0 or now_s - completed_s > self.cfg.max_external_age_s:
            return "too_old"
        return "clock_ahead" if completed_s - now_s > self.cfg.max_clock_skew_s else None

    def _freshness_reason(
        self, group: rollout_pb2.RolloutGroup, origin: Origin, now_s: float, target_version: int
    ) -> str | None:
        """External: age since completed_at (unset = infinitely old). Local: policy versions between
        the group's sampling policy and the batch it would join. A peer's policy version says
        nothing about ours, and our own clock-free version count is the better bound locally."""
        if origin == "external":
            return self._age_reason(completed_seconds(group), now_s)
        lag = target_version - group.policy_version
        return "stale" if lag > self.cfg.max_policy_lag else None


def _split_reason(split: int, group_id: str, node: str) -> str | None:
    """Only training items are trained on. The provenance's split (`Split` enum number), read from the
    proto or the facts header so the lazy arrival path needs no `question_from_proto`; an unset split
    is malformed, as `question_from_proto` says too."""
    if split == question_pb2.SPLIT_TRAIN:
        return None
    if split == question_pb2.SPLIT_EVAL:
        return "not_train_split"
    raise InvalidMessageError("missing_split", f"group {group_id} from {node}")


def _claims_signal(claimed: list[float]) -> bool:
    """Whether the sender's rewards differ. A non-finite claim is a sender bug: it claims nothing
    usable. Rewards are 32-bit on the wire, so their double sum is finite exactly when every one is
    (see `sapo.wire`). The spread test is `has_signal`'s, without its input checks: this runs on
    every group a lazy sampler reads."""
    return math.isfinite(sum(claimed)) and max(claimed) - min(claimed) > SIGNAL_TOLERANCE


def _with_completions(
    group: rollout_pb2.RolloutGroup, kept: list[rollout_pb2.Completion]
) -> rollout_pb2.RolloutGroup:
    copy = rollout_pb2.RolloutGroup()
    copy.CopyFrom(group)
    del copy.completions[:]
    copy.completions.extend(kept)
    return copy
