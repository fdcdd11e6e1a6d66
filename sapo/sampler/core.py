"""One node's sampler without transport: screen each group, pool it, number and build the batches.

Both the sampler service (`sapo.node.sampler`, which feeds it consumed Kafka records and publishes
what it returns) and the in-process swarm (`sapo.swarm.inprocess`, which feeds it groups directly) run
this class, so the two admit, pool and batch groups identically. `H` is whatever the caller needs back
with each pooled group: the service's consumed record (to finish its offset), or nothing.

Batch numbering: `sequence` is the next batch's sequence, continued from the `History` a restart
recovers. It advances when the caller says the batch is out (`emitted`), so a batch that failed to
publish is built again with the same id, and it jumps forward to what the node's trainer has trained
(`follow_trainer`) when that is further: a node reinstalled with its checkpoints but not its topics
has an empty batch topic and would otherwise number from 0 while its trainer skips every batch below
the sequence it expects. Two sources say how far the trainer got, each enough alone:

- its announcements on the node's policy topic (`next_sequence_of`: the sequence it trained last + 1,
  or the version, a lower bound, from a trainer that does not say);
- every local group, sampled with a policy version p the trainer announced, which it could only do
  after training p batches, so its next sequence is at least p. Local groups exist only once the
  trainer has planned their round right after an announcement (`sapo.node.planner`), so they close
  the gap between the sampler starting and reading the announcement.

In a node whose batch topic is intact both are no-ops: the trainer only trained what this sampler
numbered. Lock-step rounds follow the announced version the same way (`Assembler.skip_to_round`).

Warm start (`sapo.sampler.warm`) runs on the same screen before the first live group: `warm_start`
makes it, its batches are built and numbered here like live ones, and `joined` moves lock-step to
the round after them.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from sapo.identity import Sender
from sapo.sampler.assembler import Assembler, Assembly, AssemblyConfig, Discard, make_assembler
from sapo.sampler.batch import History, Position, build_batch
from sapo.sampler.fairness import Admission
from sapo.sampler.screen import Origin, Scored, Screen, ScreenConfig, Unread, unread_scored
from sapo.sampler.seen import SeenGroups
from sapo.sampler.warm import WarmConfig, WarmStart, needs_warm_start
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2
from sapo.wire import validate_batch

H = TypeVar("H")

FRESH_REASONS: Final = frozenset({"no_signal", "too_few_completions"})
"""Verdicts on a fresh group's content (as opposed to duplicates, stale or foreign groups): the
streaming modes count such groups as a round's work done."""


def next_sequence_of(update: policy_pb2.PolicyUpdate) -> int:
    """The lowest batch sequence the trainer that announced `update` accepts next (module docstring)."""
    return update.sequence + 1 if update.HasField("sequence") else update.version


class SamplerCore(Generic[H]):
    """Screen + assembler + batch numbering for one node; see the module docstring."""

    def __init__(self, screen: ScreenConfig, assembly: AssemblyConfig, history: History) -> None:
        self.node_id = screen.node_id
        self.sequence = history.next_sequence
        self.history = history
        self._assembly_cfg = assembly
        seen = SeenGroups(screen.dedupe_capacity, history.used_group_ids)
        self.screen = Screen(screen, seen, on_arrival=self._arrived)
        self.assembler: Assembler[H] = make_assembler(assembly, history.next_round, self.screen.verify)
        self.follow_trainer(history.trainer_next_sequence, history.trainer_version)

    def admit(
        self, group: rollout_pb2.RolloutGroup, origin: Origin, handle: H, now_s: float, sender: Sender
    ) -> str | None:
        """Screen and pool one decoded group sent by `sender` (`sapo.sampler.sender`); the reason it
        was not pooled, or None when it was. Raises `InvalidMessageError` for a malformed or
        unverifiable group, or one that is not its sender's (the caller dead-letters it)."""
        if origin == "local" and group.node_id == self.node_id:  # announced first: module docstring
            self.follow_trainer(group.policy_version, group.policy_version)
        verdict = self.screen.check(group, origin, now_s, self.sequence, sender)
        return self._pool(verdict, origin, handle, now_s)

    def admit_unread(self, unread: Unread, handle: H, now_s: float, sender: Sender) -> str | None:
        """`admit` of a swarm group on its facts header, without decoding it (`Screen.check_facts`;
        `sapo.sampler.screen.arrival_facts` says when). `sender` must name a node."""
        node = sender.node_id
        if not node:
            raise ValueError("a group screened on its headers needs the node its sender names")
        reason = self.screen.facts_reason(unread, now_s, node)
        if reason is not None:
            return self._refused(reason, "external")
        self.assembler.screened("external")
        place = self.assembler.place("external", node, unread.facts.round)
        if isinstance(place, str):  # refused before its pooled form is built: `Assembler.place`
            return place
        return self._add(unread_scored(unread, node), handle, now_s, place)

    def sheds(self, peer: str) -> str | None:
        """ "pool_full" when the pool has no place for any swarm group of `peer` now (its fair share is
        taken: `sapo.sampler.fairness`), so a group it sends can be refused before it is identified,
        decoded or screened; None otherwise (always in lock-step, where the round decides). Most of a
        large swarm's arrivals are refused a place (61-79% at 10,000 nodes), and finding that out then
        costs a lookup, not a signature check, a decode and the filters. Exact: the pool takes or
        refuses a group on its peer alone, and nothing changes the pool between this and `admit`."""
        return self.assembler.sheds(peer)

    def _pool(self, verdict: Scored | str, origin: Origin, handle: H, now_s: float) -> str | None:
        """Pool a screened group; the reason it was not pooled, or None."""
        if isinstance(verdict, str):
            return self._refused(verdict, origin)
        self.assembler.screened(origin)
        return self._add(verdict, handle, now_s)

    def _refused(self, reason: str, origin: Origin) -> str:
        if reason in FRESH_REASONS:
            self.assembler.screened(origin)
        return reason

    def _add(self, scored: Scored, handle: H, now_s: float, place: Admission | None = None) -> str | None:
        refusal = self.assembler.add(scored, handle, now_s, place)
        if refusal is None:
            self.screen.seen.add(scored.group_id)
        return refusal

    def next_batch(self, now_s: float) -> Assembly[H] | None:
        """The batch due now (its groups leave the pool), or None."""
        return self.assembler.next_batch(now_s, self.sequence)

    def build(
        self, assembly: Assembly[H], positions: list[Position], created_at: Timestamp
    ) -> batch_pb2.TrainingBatch:
        """The `TrainingBatch` of an assembly, numbered `sequence`; `positions` are its groups' inputs."""
        batch = build_batch(
            self.node_id,
            self.sequence,
            [e.scored for e in assembly.entries],
            positions,
            round_=assembly.round,
            created_at=created_at,
            warm_start=assembly.warm,
        )
        problem = validate_batch(batch)
        if problem is not None:  # a bug here, never bad input: refuse to hand the trainer garbage
            raise RuntimeError(f"assembled an invalid batch {batch.batch_id}: {problem}")
        return batch

    def warm_start(self, cfg: WarmConfig) -> WarmStart[H] | None:
        """A warm start over this core's screen, or None when the node has trained already (its
        history says so: `needs_warm_start`)."""
        if not needs_warm_start(self.history):
            return None
        return WarmStart(cfg, self.screen, self._assembly_cfg, self.history.warm_batches)

    def joined(self) -> None:
        """Warm start is over: lock-step waits for the round of the next sequence (the version the
        trainer will announce once it trained the warm batches)."""
        self.assembler.skip_to_round(self.sequence, expected=True)

    def follow_trainer(self, next_sequence: int, version: int) -> int | None:
        """The trainer accepts sequences from `next_sequence` on and announced `version`: number the
        next batch no lower, and (lock-step) skip rounds before `version`. Returns the sequence it
        moved from, or None when it did not move."""
        self.assembler.skip_to_round(version)
        if next_sequence <= self.sequence:
            return None
        previous, self.sequence = self.sequence, next_sequence
        return previous

    def emitted(self) -> None:
        """The batch numbered `sequence` is out: number the next one."""
        self.sequence += 1

    def take_discards(self) -> list[Discard[H]]:
        """Pooled groups dropped since the last call (expired, evicted, unused, rejected at selection)."""
        return self.assembler.take_discards()

    def forget(self, group_ids: set[str]) -> None:
        """Drop these pooled groups unfinished and let their ids be accepted again (a partition moved
        to another consumer, which will deliver them there)."""
        for entry in self.assembler.forget(group_ids):
            self.screen.seen.discard(entry.group_id)

    def _arrived(self, node: str, group_id: str, round_: int, origin: Origin, now_s: float) -> None:
        self.assembler.arrived(node, group_id, round_, origin, now_s)
