"""Warm start (late join): train on the swarm topic's retained history before the first live round.

A node that has trained nothing yet (`needs_warm_start`) reads the swarm topic from its beginning and
hands every group to `WarmStart.admit`, which runs the live screen (`Screen.check`: the same identity,
configuration, dedupe, re-derivation, re-scoring and signal filters, the same reasons) with two
differences, both bounds on history: the age bound is `WarmConfig.max_age_s` instead of the live
`max_external_age_s` (history is older than live traffic by definition), and verification is always
eager (every kept group is a candidate, so lazy verification would save nothing). The newest
`max_groups` usable groups are kept (by completion time); older ones are evicted.

`WarmStart.plan` then makes the warm-start batches, one per history round, each holding that round's
kept groups chosen as live external groups are (the selection policy, the per-source quota, at most
I + J groups: a warm batch is as large as a live one, all external):

- lock-step: a node's round r is generated with policy version r, and a version is one batch, so a
  late node can join the swarm's round h only after h batches. Warm start replays every round from
  the node's next round to h (exclusive): h is the highest round of any genuine swarm group read (the
  screen's arrival hook, before the age and signal filters: the swarm's rounds, usable or not), and a
  round without a kept group gives an empty batch (the trainer advances the version without a step).
  Round h itself is left to the live stream, which re-reads the topic and pools its groups. With more
  than `max_batches` rounds to replay, only the newest `max_batches` are, and the node's rounds then
  lag the swarm's (as they would without warm start; logged).
- deadline / async: rounds are not shared between nodes, so only rounds with kept groups give a
  batch, the newest `max_batches` of them, oldest first.

A warm batch is numbered like any other (`round` = sequence) and flagged `warm_start`. Planned groups
enter the dedupe set, so the live stream, which reads the same history again, never uses them twice;
lock-step refuses the replayed rounds' other groups as late_round. Restart safety comes from the
batch topic: `needs_warm_start` holds while every batch there is a warm one, and a restarted sampler
resumes with the rounds after its last warm batch (the dedupe set holds the groups used so far) and
the batches left of `max_batches`.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from sapo.identity import Sender
from sapo.sampler.assembler import Assembly, AssemblyConfig, Discard, RoundMode
from sapo.sampler.batch import History
from sapo.sampler.pool import Entry
from sapo.sampler.screen import Origin, Scored, Screen, VerifyMode
from sapo.sampler.selection import pick_external, usable_external
from sapo.v1 import rollout_pb2

log = logging.getLogger(__name__)
H = TypeVar("H")


@dataclass(frozen=True)
class WarmConfig:
    """The bounds on history; built from `WarmStartSettings.config`, where every value is declared."""

    max_age_s: float
    max_groups: int
    max_batches: int


def needs_warm_start(history: History) -> bool:
    """Whether a node with this history warm-starts: it has emitted no live batch (none at all on a
    first start, only warm ones after a restart during warm start) and its trainer did not train
    beyond its batch topic (a node reinstalled with its checkpoints has trained)."""
    return history.batches == history.warm_batches and history.trainer_next_sequence <= history.next_sequence


def replay_rounds(
    kept_rounds: set[int], next_round: int, join_round: int | None, lockstep: bool, budget: int
) -> list[int]:
    """The history round each warm batch replays, in order (module docstring); `join_round` is the
    lock-step round the node joins (None: nothing was read, it joins its own next round)."""
    if budget <= 0:
        return []
    if lockstep:
        join = next_round if join_round is None else max(next_round, join_round)
        return list(range(max(next_round, join - budget), join))
    return sorted(kept_rounds)[-budget:]


class WarmStart(Generic[H]):
    """History groups admitted through the live screen, and the warm batches made of them."""

    def __init__(self, cfg: WarmConfig, screen: Screen, assembly: AssemblyConfig, batches_done: int) -> None:
        self.cfg = cfg
        self._assembly = assembly
        history_cfg = replace(screen.cfg, max_external_age_s=cfg.max_age_s, verify=VerifyMode.EAGER)
        self._screen = screen.sibling(history_cfg, on_arrival=self._arrived)
        self._budget = cfg.max_batches - batches_done
        self._kept: dict[str, Entry[H]] = {}
        self._by_age: list[tuple[float, int, str]] = []  # (completed_s, arrival, group id): oldest first
        self._discards: list[Discard[H]] = []
        self.highest_round: int | None = None
        """The highest round of a genuine swarm group read (lock-step joins there)."""
        self.read = 0
        self.rejected: Counter[str] = Counter()

    def admit(self, group: rollout_pb2.RolloutGroup, handle: H, now_s: float, sender: Sender) -> str | None:
        """Screen one history group as the live stream would; keep it (None) or say why not. Raises
        `InvalidMessageError` as `Screen.check` does (the caller counts it; the live stream, which
        reads the same record again, dead-letters it)."""
        self.read += 1
        verdict = self._screen.check(group, "external", now_s, 0, sender)
        if isinstance(verdict, Scored) and verdict.group_id in self._kept:  # the topic holds it twice
            verdict = "duplicate"
        if isinstance(verdict, str):
            self.rejected[verdict] += 1
            return verdict
        self._kept[verdict.group_id] = Entry(verdict, handle, now_s)
        heapq.heappush(self._by_age, (verdict.completed_s, self.read, verdict.group_id))
        if len(self._kept) > self.cfg.max_groups:
            _, _, oldest = heapq.heappop(self._by_age)
            self._discards.append(Discard(self._kept.pop(oldest), "evicted"))
            self.rejected["evicted"] += 1
        return None

    def plan(self, first_sequence: int, next_round: int, join_round: int | None = None) -> list[Assembly[H]]:
        """The warm batches, in order, for sequences from `first_sequence` on; `next_round` is the
        node's next lock-step round, `join_round` the one it joins (None: the highest round read).
        Kept groups no batch takes are discarded as unused; the ones taken enter the dedupe set."""
        lockstep = self._assembly.mode is RoundMode.LOCKSTEP
        join = self.highest_round if join_round is None else join_round
        by_round: dict[int, list[Entry[H]]] = {}
        for entry in self._kept.values():
            by_round.setdefault(entry.scored.round, []).append(entry)
        rounds = replay_rounds(set(by_round), next_round, join, lockstep, self._budget)
        if lockstep and join is not None and join - next_round > len(rounds):
            log.warning(
                "warm start: the swarm is at round %d, more than MAX_BATCHES=%d rounds ahead of round %d: "
                "replaying rounds %d..%d only; this node's lock-step rounds will lag the swarm's",
                join,
                self.cfg.max_batches,
                next_round,
                rounds[0] if rounds else next_round,
                rounds[-1] if rounds else next_round,
            )
        assemblies = [
            Assembly([], self._pick(by_round.get(r, []), first_sequence + i), warm=True)
            for i, r in enumerate(rounds)
        ]
        taken = {e.group_id for a in assemblies for e in a.external}
        for group_id in taken:
            self._screen.seen.add(group_id)
        unused = [e for e in self._kept.values() if e.group_id not in taken]
        self._discards.extend(Discard(e, "unused") for e in unused)
        self.rejected["unused"] += len(unused)
        self._kept.clear()
        return assemblies

    def take_discards(self) -> list[Discard[H]]:
        """Kept groups dropped since the last call (evicted by newer ones, or unused by `plan`)."""
        out, self._discards = self._discards, []
        return out

    def _pick(self, entries: list[Entry[H]], sequence: int) -> list[Entry[H]]:
        """One round's groups as a live batch takes external ones: at most I + J, the quota, the policy."""
        cfg = self._assembly
        counts = Counter(e.scored.peer for e in entries)
        n = usable_external(counts.values(), cfg.max_per_source, cfg.mix.total)
        rng = random.Random(f"{cfg.seed}/warm/{sequence}")  # a resumed warm start re-makes the same choice
        return pick_external(entries, n, cfg.max_per_source, cfg.selection, rng)

    def _arrived(self, _node: str, _group_id: str, round_: int, origin: Origin, _now_s: float) -> None:
        if origin == "external":
            self.highest_round = max(round_, self.highest_round or 0)
