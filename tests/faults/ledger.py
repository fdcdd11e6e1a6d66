"""The end-of-run accounting of a fault-injection run, from what the topics hold and nothing else.

Processes killed with SIGKILL lose their in-memory counters, so the ledger is built from durable
records only: every group a node generated (its rollouts topic), every batch its sampler emitted (its
batches topic), every version its trainer announced (its policy topic: the trained batch id and the
manifest digest) and every dead letter (its DLQ topic, with the reason and the source topic).

What it checks, per node:
- every generated local group is in exactly one trained batch of its node, or is one the sampler
  drops by rule (fewer than two scored completions, or no reward spread: no GRPO signal; unless the
  node keeps local zero-advantage groups), or was dead-lettered with a reason; anything else is *lost*;
- no group is in two trained batches of one node and no batch id was trained under two versions
  (*trained twice*);
- a version announced more than once (a trainer that replayed from an older state) names the same
  batch and the same manifest digest every time;
- every trained batch id is a batch the sampler emitted, and every version from 1 to the last exists.

Topic records may repeat (a producer retry across a broker restart, a generator or sampler redoing
work after a restart): repeats are counted, and two records of one batch id must hold the same groups
(otherwise which one was trained would be ambiguous).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from sapo.grpo.advantages import has_signal
from sapo.sampler.screen import MIN_COMPLETIONS
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2

LOCAL = batch_pb2.GROUP_SOURCE_LOCAL


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ record reduced to what accounting needs."""

    reason: str
    source_topic: str
    group_id: str | None  # the dead-lettered group's id when the value is a whole RolloutGroup
    batch_id: str | None  # the quarantined batch's id when the value is a whole TrainingBatch


@dataclass
class NodeLedger:
    node: str
    rollout_records: int = 0
    groups_generated: int = 0
    groups_trained: int = 0
    groups_without_signal: int = 0
    groups_dead_lettered: Counter[str] = field(default_factory=Counter)
    external_groups_trained: int = 0
    batch_records: int = 0
    batches_emitted: int = 0
    batches_trained: int = 0
    batches_quarantined: int = 0
    policy_records: int = 0
    last_version: int = 0
    lost: list[str] = field(default_factory=list)
    trained_twice: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _without_signal(group: rollout_pb2.RolloutGroup) -> bool:
    """Dropped by rule: the sampler never trains such a local group (see sapo.sampler.screen)."""
    rewards = [c.reward for c in group.completions if c.HasField("reward")]
    return len(rewards) < MIN_COMPLETIONS or not has_signal(rewards)


def _trained_versions(updates: list[policy_pb2.PolicyUpdate], problems: list[str]) -> dict[int, str]:
    """Version -> trained batch id; every announcement of a version must name the same batch and digest."""
    seen: dict[int, tuple[str, str]] = {}
    for update in updates:
        if update.version == 0:
            continue
        claim = (update.batch_id, update.manifest_sha256)
        if seen.setdefault(update.version, claim) != claim:
            problems.append(f"version {update.version} announced as {seen[update.version]} and as {claim}")
    missing = sorted(set(range(1, max(seen, default=0) + 1)) - set(seen))
    if missing:
        problems.append(f"versions never announced: {missing}")
    return {version: batch_id for version, (batch_id, _) in seen.items()}


def node_ledger(
    node: str,
    rollouts: list[rollout_pb2.RolloutGroup],
    batches: list[batch_pb2.TrainingBatch],
    updates: list[policy_pb2.PolicyUpdate],
    dead_letters: list[DeadLetter],
    *,
    keeps_zero_advantage: bool = False,
) -> NodeLedger:
    """The accounting of one node (see the module docstring)."""
    ledger = NodeLedger(node, rollout_records=len(rollouts), batch_records=len(batches))
    ledger.policy_records = len(updates)
    problems = ledger.problems
    groups: dict[str, rollout_pb2.RolloutGroup] = {}
    for group in rollouts:  # a group generated again after a kill keeps its id (a pure function)
        groups.setdefault(group.group_id, group)
    emitted: dict[str, batch_pb2.TrainingBatch] = {}
    for batch in batches:
        first = emitted.setdefault(batch.batch_id, batch)
        if _batch_identity(first) != _batch_identity(batch):
            problems.append(f"two records of batch {batch.batch_id} hold different groups")
    versions = _trained_versions(updates, problems)
    ledger.groups_generated = len(groups)
    ledger.batches_emitted = len(emitted)
    ledger.last_version = max(versions, default=0)

    by_batch = Counter(versions.values())
    ledger.trained_twice += [f"batch {bid} trained as {n} versions" for bid, n in by_batch.items() if n > 1]
    ledger.batches_trained = len(by_batch)
    quarantined = {d.batch_id for d in dead_letters if d.batch_id is not None}
    ledger.batches_quarantined = len(quarantined)
    uses: Counter[str] = Counter()
    local_uses: Counter[str] = Counter()
    for bid in by_batch:
        if bid not in emitted:
            problems.append(f"trained batch {bid} is not on the batches topic")
            continue
        for member in emitted[bid].groups:
            uses[member.group.group_id] += 1
            if member.source == LOCAL:
                local_uses[member.group.group_id] += 1
            else:
                ledger.external_groups_trained += 1
    ledger.trained_twice += [f"group {gid} in {n} trained batches" for gid, n in uses.items() if n > 1]
    quarantined_groups = {
        m.group.group_id for bid in quarantined if bid in emitted for m in emitted[bid].groups
    }
    dead_groups = {d.group_id: d.reason for d in dead_letters if d.group_id is not None}
    for gid, group in groups.items():
        if local_uses[gid]:
            ledger.groups_trained += 1
        elif gid in dead_groups:
            ledger.groups_dead_lettered[dead_groups[gid]] += 1
        elif gid in quarantined_groups:
            ledger.groups_dead_lettered["poison_batch"] += 1
        elif not keeps_zero_advantage and _without_signal(group):
            ledger.groups_without_signal += 1
        else:
            ledger.lost.append(f"group {gid} (round {group.round}, position {group.position})")
    return ledger


def _batch_identity(batch: batch_pb2.TrainingBatch) -> list[tuple[str, int]]:
    """What must agree between two records of one batch id: its groups, in order (a re-sent batch gets
    a new creation time)."""
    return [(m.group.group_id, m.source) for m in batch.groups]


def parse_dead_letter(reason: str, source_topic: str, value: bytes, *, batches_topic: str) -> DeadLetter:
    """A DLQ record's group or batch id when its (possibly truncated) value still decodes."""
    group_id = batch_id = None
    try:
        if source_topic == batches_topic:
            batch_id = batch_pb2.TrainingBatch.FromString(value).batch_id or None
        else:
            group_id = rollout_pb2.RolloutGroup.FromString(value).group_id or None
    except DecodeError:  # a truncated or hostile value: its reason is still counted
        pass
    return DeadLetter(reason, source_topic, group_id, batch_id)


def totals(ledgers: Mapping[str, NodeLedger]) -> dict[str, int]:
    """The swarm-wide sums the report prints."""
    out: dict[str, int] = defaultdict(int)
    for ledger in ledgers.values():
        for name in (
            "rollout_records",
            "groups_generated",
            "groups_trained",
            "groups_without_signal",
            "external_groups_trained",
            "batch_records",
            "batches_emitted",
            "batches_trained",
            "batches_quarantined",
            "policy_records",
        ):
            out[name] += getattr(ledger, name)
        out["groups_dead_lettered"] += sum(ledger.groups_dead_lettered.values())
        out["lost"] += len(ledger.lost)
        out["trained_twice"] += len(ledger.trained_twice)
        out["problems"] += len(ledger.problems)
    return dict(out)
