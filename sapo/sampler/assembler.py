"""Round modes: when a batch is due and which pooled groups it takes.

- `lockstep` (the paper): batch r holds the node's own round-r groups and the swarm's round-r groups.
  Round r is due once all `questions_per_round` local round-r groups arrived (or
  `lockstep_local_timeout_s` passed since the first did: a lost local group must not stall the node
  forever) and then either `expected_peers` peers sent a round-r group or `lockstep_timeout_s`
  passed. I local groups are sampled uniformly from the round's local groups with signal, J from the
  round's external ones; everything else of the round is discarded ("unused"). The batch is emitted
  even with zero groups, so the round (and the trainer's policy version) advances. The round taken is
  the lowest one at or after the next round that has local groups: a generator that starts at another
  round number, or skips one, never stalls the sampler, and nothing of an older round is ever read.
  Lock-step needs a swarm that starts together; groups more than LOCKSTEP_WINDOW rounds ahead are
  refused ("future_round"), groups of closed rounds too ("late_round").
- `deadline`: due when I local groups are pooled and J external ones, or `deadline_s` after the I
  local groups were there; missing external slots are then filled from local.
- `async`: due whenever I local and J external groups are pooled, or `async_timeout_s` after the I
  local groups were there (missing external slots filled from local, as in `deadline`): a generous
  bound, there so that peers that stopped publishing (a bounded run's peers that finished, nodes that
  left) cannot stall the node for good.
- Both streaming modes wait for no more external groups than `expected_peers` peers can give one
  batch under `max_per_source`: with the pool holding that many, the batch is due and its missing
  external slots are filled from local. A swarm with fewer peers than J / max_per_source would
  otherwise wait for ever (async) or for every deadline, and since the generators may run only
  `max_ahead` versions ahead, every node of it would stop.
- Both streaming modes: when a whole round of fresh local groups (`questions_per_round`) was screened
  since the last batch and fewer than I of them had signal, the batch is due with what is pooled (even
  nothing). Otherwise a node whose rounds rarely have signal would deadlock: the generator may run only
  `max_ahead` versions ahead of the trainer, and the trainer only advances on a batch.

In the streaming modes local groups are taken oldest first (they only get staler), external ones by
the selection policy. Every mode expires pooled groups that outlived the age / staleness bounds.
The assembler never finishes input itself: discarded entries queue up for `take_discards()`.

Lazy verification (`sapo.sampler.screen.VerifyMode`): pooled external groups may be unverified. The
selection verifies each one it picks (`verify`); a rejected one leaves the pool as a discard with its
reason (and its `InvalidMessageError` when eager would have dead-lettered it) and the next candidate
takes its place. The I/J plan counted the rejected ones, so when a pick comes up short after a
rejection the batch is planned again on the pool without them: a batch keeps the configured mix
whenever the verified pool allows it, as under eager verification. Each retry follows a rejection,
which shrinks the pool, so the loop ends.
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Generic, TypeVar

from sapo.sampler.fairness import Admission
from sapo.sampler.pool import Entry, Pool
from sapo.sampler.screen import Origin, Scored
from sapo.sampler.selection import Mix, SelectionPolicy, pick_external, plan, usable_external
from sapo.wire import InvalidMessageError

log = logging.getLogger(__name__)
H = TypeVar("H")
Verify = Callable[[Scored], Scored | str]
"""`Screen.verify`: the verified group or the reason it is not used; raises InvalidMessageError."""

LOCKSTEP_WINDOW: Final = 16
"""Rounds ahead of the next one whose groups lock-step keeps (bounds memory against wild rounds)."""


class RoundMode(StrEnum):
    LOCKSTEP = "lockstep"
    DEADLINE = "deadline"
    ASYNC = "async"


@dataclass(frozen=True)
class AssemblyConfig:
    """What the round modes need to know; built from `SamplerSettings.assembly_config`, where every value
    is declared."""

    mode: RoundMode
    mix: Mix
    selection: SelectionPolicy
    max_per_source: int
    max_pool_groups: int
    max_external_age_s: float
    max_policy_lag: int
    questions_per_round: int
    expected_peers: int
    lockstep_timeout_s: float
    lockstep_local_timeout_s: float
    deadline_s: float
    async_timeout_s: float
    seed: int


@dataclass(frozen=True)
class Assembly(Generic[H]):
    """The groups of one batch; `round` is the lock-step round (None in the streaming modes and for
    warm-start batches, `warm`: `sapo.sampler.warm`). `waited_out`: the batch went because its wait
    for the swarm ran out (`lockstep_timeout_s`, `deadline_s`, `async_timeout_s`) before
    `expected_peers` peers sent what it waited for."""

    local: list[Entry[H]]
    external: list[Entry[H]]
    round: int | None = None
    warm: bool = False
    waited_out: bool = False

    @property
    def entries(self) -> list[Entry[H]]:
        return [*self.local, *self.external]


@dataclass(frozen=True)
class Discard(Generic[H]):
    """An entry dropped from the pool; `error` is set when its input must be dead-lettered."""

    entry: Entry[H]
    reason: str
    error: InvalidMessageError | None = None


class Assembler(ABC, Generic[H]):
    """The pool plus the rule of one round mode. Use `make_assembler`."""

    def __init__(self, cfg: AssemblyConfig, verify: Verify | None = None) -> None:
        self.cfg = cfg
        self.pool: Pool[H] = Pool(cfg.max_pool_groups)
        self._verify = verify
        self._discards: list[Discard[H]] = []
        self._rejections = 0

    def arrived(self, node: str, group_id: str, round_: int, origin: Origin, now_s: float) -> None:
        """A genuine group of a node arrived (before the signal filter); lock-step counts these."""

    def screened(self, origin: Origin) -> None:
        """A fresh group (not a duplicate, not stale) was screened: pooled next, or without signal.
        Re-deliveries after a restart are duplicates, so they never count as new work."""

    def place(self, origin: Origin, peer: str, round_: int) -> Admission | str:
        """How a screened group of `peer` and `round_` would be pooled now, or the reason the mode
        refuses it. Asked before the group's pooled form is built (`SamplerCore.admit_unread`): most
        of a large swarm's arrivals are refused a place."""
        verdict = self.pool.admission(origin, peer)
        return "pool_full" if verdict is Admission.REFUSE else verdict

    def sheds(self, peer: str) -> str | None:
        """ "pool_full" when no swarm group of `peer` can get a place now, whatever it holds; None when
        that depends on the group (lock-step: its round). See `SamplerCore.sheds`."""
        return "pool_full" if self.pool.admission("external", peer) is Admission.REFUSE else None

    def add(
        self, scored: Scored, handle: H, now_s: float, place: Admission | str | None = None
    ) -> str | None:
        """Pool a screened group; returns a refusal reason instead when the mode cannot use it.
        `place` is the admission `place` answered for it, when nothing changed the pool since."""
        if not scored.verified and self._verify is None:
            raise ValueError(f"unverified group {scored.group_id}: this assembler was given no verify")
        where = place or self.place(scored.origin, scored.peer, scored.round)
        if isinstance(where, str):
            return where
        # tuple.__new__ skips the named tuple's Python-level __new__: one per pooled group.
        evicted = self.pool.add(tuple.__new__(Entry, (scored, handle, now_s)), where)
        if evicted is not None:
            self._discards.append(Discard(evicted, "evicted"))
        return None

    @abstractmethod
    def next_batch(self, now_s: float, sequence: int) -> Assembly[H] | None:
        """The batch due now, its entries taken out of the pool; None when none is due."""

    def take_discards(self) -> list[Discard[H]]:
        """Entries dropped since the last call; the caller finishes their input and counts them."""
        out, self._discards = self._discards, []
        return out

    def forget(self, group_ids: set[str]) -> list[Entry[H]]:
        """Drop entries without finishing them (their partition was revoked: another owner re-reads)."""
        return self.pool.take_where(lambda e: e.group_id in group_ids)

    def skip_to_round(self, round_: int, expected: bool = False) -> None:
        """Rounds before `round_` were trained (the trainer announced version `round_`, or warm start
        replayed them: `expected`, logged as information): lock-step never waits for them. The
        streaming modes have no rounds to skip."""

    def _checked(self, entry: Entry[H]) -> Entry[H] | None:
        """A picked entry in its verified form (replaced in the pool), or None when verification
        rejects it (then it is out of the pool and queued as a discard)."""
        if entry.scored.verified:
            return entry
        assert self._verify is not None  # `add` refuses unverified groups without it
        error: InvalidMessageError | None = None
        try:
            verdict = self._verify(entry.scored)
        except InvalidMessageError as exc:  # tampered or corrupt: the caller dead-letters it
            verdict, error = exc.reason, exc
        if isinstance(verdict, Scored):
            verified = Entry(verdict, entry.handle, entry.pooled_s)
            self.pool.replace(verified)
            return verified
        self.pool.remove([entry])
        self._discards.append(Discard(entry, verdict, error))
        self._rejections += 1
        return None

    def _rng(self, sequence: int) -> random.Random:
        """Per-batch randomness: the same seed and sequence make the same choice after a restart."""
        return random.Random(f"{self.cfg.seed}/{sequence}")

    def _expire(self, now_s: float, sequence: int) -> None:
        cfg, take = self.cfg, self.pool.take_aged
        expired = take("external", now_s - cfg.max_external_age_s)
        expired += take("local", sequence - cfg.max_policy_lag)
        if expired:  # asked after every record a service reads, and mostly nothing has aged
            self._discards.extend(Discard(e, "expired") for e in expired)


class StreamingAssembler(Assembler[H]):
    """`deadline` and `async`: the same rule, with the wait for the swarm bounded by `deadline_s` or
    by `async_timeout_s`."""

    def __init__(self, cfg: AssemblyConfig, wait_s: float, verify: Verify | None) -> None:
        super().__init__(cfg, verify)
        self._wait_s = wait_s
        """The longest wait for the swarm once the I local groups are in."""
        self._local_ready_s: float | None = None
        self._local_screened = 0
        """Fresh local groups screened (with or without signal) since the last batch."""
        self._min_local = cfg.mix.min_local  # read by every attempt: one after each pooled record

    def screened(self, origin: Origin) -> None:
        if origin == "local":
            self._local_screened += 1

    def _starved(self) -> bool:
        return self._local_screened >= self.cfg.questions_per_round

    def _reachable_external(self) -> int:
        """The most usable external groups `expected_peers` peers can give one batch under the quota:
        once the pool holds that many, waiting for more can only stall the node."""
        return self.cfg.expected_peers * self.cfg.max_per_source

    def next_batch(self, now_s: float, sequence: int) -> Assembly[H] | None:
        self._expire(now_s, sequence)
        while True:  # again only after a pick rejected a lazily screened group: see the module doc
            rejections = self._rejections
            assembly = self._attempt(now_s, sequence)
            if assembly is not None or self._rejections == rejections:
                return assembly

    def _attempt(self, now_s: float, sequence: int) -> Assembly[H] | None:
        mix, pool = self.cfg.mix, self.pool
        local_n = pool.count("local")
        if local_n < self._min_local and not self._starved():  # what follows would say so, slower
            self._local_ready_s = None
            return None
        external_n = usable_external(pool.peer_counts(), self.cfg.max_per_source, mix.total)
        n_local, n_external = plan(mix, local_n, external_n)
        starved = local_n < n_local and self._starved()
        if starved:  # a round came and went without I local groups with signal: take what is there
            n_local, n_external = local_n, min(n_external, external_n)
        if local_n < n_local:
            self._local_ready_s = None
            return None
        if self._local_ready_s is None:
            self._local_ready_s = now_s
        waited_out = False
        if external_n < n_external:
            waiting = now_s - self._local_ready_s < self._wait_s
            reachable = self._reachable_external()
            if waiting and external_n < reachable:
                return None
            waited_out = external_n < reachable
            if waited_out and self.cfg.mode is RoundMode.ASYNC:
                log.warning(
                    "async: %d of %d external groups in %.0f s (async_timeout_s); the batch goes with "
                    "them, the rest local: the swarm gives fewer than expected_peers can",
                    external_n,
                    min(n_external, reachable),
                    self._wait_s,
                )
            n_external = external_n
            n_local = min(local_n, mix.total - n_external)
        if n_local + n_external == 0 and not starved:
            return None
        local = pool.oldest("local", n_local)
        cfg = self.cfg
        external = pick_external(
            pool.entries("external"),
            n_external,
            cfg.max_per_source,
            cfg.selection,
            self._rng(sequence),
            accept=self._checked,
        )
        if len(local) < n_local or len(external) < n_external:
            return None  # verification took some: plan again
        pool.remove([*local, *external])
        self._local_ready_s = None
        self._local_screened = 0
        return Assembly(local, external, waited_out=waited_out)


@dataclass
class _Round:
    """What arrived of one lock-step round."""

    local_ids: set[str] = field(default_factory=set)
    peers: set[str] = field(default_factory=set)
    first_local_s: float | None = None
    local_done_s: float | None = None


class LockstepAssembler(Assembler[H]):
    """`lockstep`: see the module docstring."""

    def __init__(self, cfg: AssemblyConfig, next_round: int, verify: Verify | None) -> None:
        super().__init__(cfg, verify)
        self.next_round = next_round
        self._rounds: dict[int, _Round] = {}

    def _in_window(self, round_: int) -> bool:
        return self.next_round <= round_ < self.next_round + LOCKSTEP_WINDOW

    def skip_to_round(self, round_: int, expected: bool = False) -> None:
        if round_ <= self.next_round:
            return
        log.log(
            logging.INFO if expected else logging.WARNING,
            "lock-step: rounds %d..%d were trained already; continuing at %d",
            self.next_round,
            round_ - 1,
            round_,
        )
        self.next_round = round_
        self._rounds = {r: s for r, s in self._rounds.items() if r >= round_}
        late = self.pool.take_where(lambda e: e.scored.round < round_)
        self._discards.extend(Discard(e, "late_round") for e in late)

    def arrived(self, node: str, group_id: str, round_: int, origin: Origin, now_s: float) -> None:
        if not self._in_window(round_):
            return
        state = self._rounds.setdefault(round_, _Round())
        if origin == "external":
            if len(state.peers) < self.cfg.expected_peers:  # bounded: more peers change nothing
                state.peers.add(node)
            return
        if state.first_local_s is None:
            state.first_local_s = now_s
        if len(state.local_ids) < self.cfg.questions_per_round:
            state.local_ids.add(group_id)
        if len(state.local_ids) >= self.cfg.questions_per_round and state.local_done_s is None:
            state.local_done_s = now_s

    def sheds(self, peer: str) -> str | None:
        return None  # a group's round decides, and it counts as an arrival of its round when refused

    def place(self, origin: Origin, peer: str, round_: int) -> Admission | str:
        if round_ < self.next_round:
            return "late_round"
        if not self._in_window(round_):
            return "future_round"
        return super().place(origin, peer, round_)

    def next_batch(self, now_s: float, sequence: int) -> Assembly[H] | None:
        started = [r for r, s in self._rounds.items() if s.first_local_s is not None]
        if not started:
            return None
        round_ = min(started)
        if not self._due(self._rounds[round_], now_s, round_):
            return None
        self._expire(now_s, sequence)
        if round_ > self.next_round:
            log.warning("lock-step: no local groups of rounds %d..%d", self.next_round, round_ - 1)
        picked_local, picked_external = self._pick_round(round_, sequence)
        self.pool.remove([*picked_local, *picked_external])
        unused = self.pool.take_where(lambda e: e.scored.round <= round_)
        self._discards.extend(Discard(e, "unused") for e in unused)
        # _due let the round go with fewer peers than expected only once lockstep_timeout_s passed.
        state = self._rounds[round_]
        waited_out = self.cfg.mix.wants_external and len(state.peers) < self.cfg.expected_peers
        if waited_out:
            log.warning(
                "lock-step round %d: %d of %d expected peers after %.0f s (lockstep_timeout_s); closing "
                "it without the rest",
                round_,
                len(state.peers),
                self.cfg.expected_peers,
                self.cfg.lockstep_timeout_s,
            )
        self.next_round = round_ + 1
        self._rounds = {r: s for r, s in self._rounds.items() if r > round_}
        return Assembly(picked_local, picked_external, round_, waited_out=waited_out)

    def _pick_round(self, round_: int, sequence: int) -> tuple[list[Entry[H]], list[Entry[H]]]:
        """I local sampled uniformly and J external by the selection policy, of the round's groups;
        planned again when a short pick rejected a lazily screened group (module docstring)."""
        quota, mix = self.cfg.max_per_source, self.cfg.mix
        while True:
            rejections = self._rejections
            rng = self._rng(sequence)
            local = [e for e in self.pool.entries("local") if e.scored.round == round_]
            external = [e for e in self.pool.entries("external") if e.scored.round == round_]
            usable = usable_external(_peer_counts(external), quota, mix.total)
            n_local, n_external = plan(mix, len(local), usable)
            picked_local = rng.sample(local, min(n_local, len(local)))
            picked_external = pick_external(
                external, n_external, quota, self.cfg.selection, rng, accept=self._checked
            )
            if len(picked_external) == n_external or self._rejections == rejections:
                return picked_local, picked_external

    def _due(self, state: _Round, now_s: float, round_: int) -> bool:
        cfg = self.cfg
        if state.local_done_s is None:
            assert state.first_local_s is not None
            if now_s - state.first_local_s < cfg.lockstep_local_timeout_s:
                return False
            log.warning(
                "lock-step round %d: %d of %d local groups after %.0f s; closing it without the rest",
                round_,
                len(state.local_ids),
                cfg.questions_per_round,
                cfg.lockstep_local_timeout_s,
            )
            state.local_done_s = now_s
        if not cfg.mix.wants_external or len(state.peers) >= cfg.expected_peers:
            return True
        return now_s - state.local_done_s >= cfg.lockstep_timeout_s


def _peer_counts(entries: list[Entry[H]]) -> list[int]:
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.scored.peer] = counts.get(e.scored.peer, 0) + 1
    return list(counts.values())


def make_assembler(cfg: AssemblyConfig, next_round: int = 0, verify: Verify | None = None) -> Assembler[H]:
    """The assembler of the configured mode; `next_round` is the first lock-step round to close;
    `verify` (`Screen.verify`) is needed when lazily screened groups are pooled."""
    if cfg.mode is RoundMode.LOCKSTEP:
        return LockstepAssembler(cfg, next_round, verify)
    if cfg.mode is RoundMode.DEADLINE:
        return StreamingAssembler(cfg, cfg.deadline_s, verify)
    return StreamingAssembler(cfg, cfg.async_timeout_s, verify)
