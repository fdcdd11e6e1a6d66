"""Which groups make a batch: the I/J mix, the per-source quota, and the choice of J external groups.

I/J policies (`plan`):
- `fixed`: always I local and J external, as in the paper (its best swarm: 4 local / 4 external).
- `adaptive`: I + J stays fixed and J moves within [min_external, max_external] (a streaming batch
  goes below min_external when the expected peers cannot give that many: `sapo.sampler.assembler`).
  When fewer than I local groups have signal, the free slots go to the swarm (J = I + J -
  local_available); when the external pool holds fewer than J usable groups, the slots go back to
  local (J = external_available).
  The bounds exist because the paper's 2 local / 6 external run oscillated and forgot: a node must not
  drift into relying on the swarm alone.

External choice (`pick_external`), always under the quota of at most `quota` groups per peer:
- `uniform`: every pooled group equally likely (the paper's sampling).
- `reward_guided`: weighted sampling without replacement with weight
  w(g) = REWARD_WEIGHT_FLOOR + mean(receiver rewards of g). Every pooled group has signal, so its mean
  lies strictly inside (0, 1); groups on which the sender's policy succeeded more often carry more
  correct completions, the "aha moments" SAPO spreads through the swarm. The floor keeps groups with
  only partial-credit successes in play. Implemented with Efraimidis-Spirakis keys u ** (1 / w):
  the k largest keys are a weighted sample; the quota is applied greedily in key order.

Lazy verification (`sapo.sampler.screen`) passes `accept`, which verifies each candidate as the walk
reaches it: a rejected one is skipped and the walk goes on, so the next candidate in the same order
takes its place. The uniform order is drawn as the walk reads it (`shuffled`: k candidates cost k
draws, not one per pooled group), but no draw depends on what verification found, so the accepted
groups keep the order's distribution over the groups that pass (see the screen's module docstring).
Reward-guided weights would come from the senders' claims there, which a sender can inflate, so the
settings refuse that combination.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from sapo.sampler.pool import Entry

H = TypeVar("H")
T = TypeVar("T")

REWARD_WEIGHT_FLOOR = 0.1


class SelectionPolicy(StrEnum):
    UNIFORM = "uniform"
    REWARD_GUIDED = "reward_guided"


class MixPolicy(StrEnum):
    FIXED = "fixed"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class Mix:
    """The I/J composition of a batch and how it may move."""

    local: int
    external: int
    policy: MixPolicy = MixPolicy.FIXED
    min_external: int = 0
    max_external: int = 0

    @property
    def total(self) -> int:
        return self.local + self.external

    @property
    def min_local(self) -> int:
        """The fewest local groups `plan` ever asks of a batch, whatever is on hand."""
        return self.local if self.policy is MixPolicy.FIXED else self.total - self.max_external

    @property
    def wants_external(self) -> bool:
        """Whether a batch can ever hold an external group (else nobody waits for peers)."""
        return self.external > 0 or (self.policy is MixPolicy.ADAPTIVE and self.max_external > 0)


def plan(mix: Mix, local_available: int, external_available: int) -> tuple[int, int]:
    """(I, J) for the next batch given how many local groups with signal and usable external groups
    (after the quota) are on hand; see the module docstring."""
    if mix.policy is MixPolicy.FIXED:
        return mix.local, mix.external
    j = mix.external
    if local_available < mix.total - j:
        j = mix.total - local_available
    j = min(j, external_available)
    j = min(max(j, mix.min_external), mix.max_external)
    return mix.total - j, j


def usable_external(peer_counts: Iterable[int], quota: int, cap: int) -> int:
    """How many external groups one batch could take under the quota, counted up to `cap`."""
    usable = 0
    for count in peer_counts:
        usable += min(count, quota)
        if usable >= cap:
            return cap
    return usable


def reward_weight(mean_reward: float) -> float:
    return REWARD_WEIGHT_FLOOR + mean_reward


def shuffled(items: Sequence[T], rng: random.Random) -> Iterator[T]:
    """`items` in a uniformly random order, drawn as they are read: the Fisher-Yates shuffle of
    `random.shuffle` read from its last position (the reverse of its result for the same state), so a
    selection that stops after k of n candidates makes k draws, not n."""
    pending = list(items)
    for i in range(len(pending) - 1, 0, -1):
        j = rng.randrange(i + 1)
        pending[i], pending[j] = pending[j], pending[i]
        yield pending[i]
    if pending:
        yield pending[0]


def pick_external(
    entries: Sequence[Entry[H]],
    k: int,
    quota: int,
    policy: SelectionPolicy,
    rng: random.Random,
    *,
    accept: Callable[[Entry[H]], Entry[H] | None] | None = None,
) -> list[Entry[H]]:
    """Up to k entries, at most `quota` per peer, chosen by `policy`. `accept` (when given) sees each
    candidate the quota lets through and returns the entry to take, or None to skip it."""
    if k <= 0 or not entries:
        return []
    order: Iterable[Entry[H]]
    if policy is SelectionPolicy.UNIFORM:
        order = shuffled(entries, rng)
    else:
        keys = [rng.random() ** (1.0 / reward_weight(e.scored.mean_reward)) for e in entries]
        order = [e for _, e in sorted(zip(keys, entries, strict=True), key=lambda p: p[0], reverse=True)]
    picked: list[Entry[H]] = []
    per_peer: Counter[str] = Counter()
    for entry in order:
        peer = entry.scored.peer
        if per_peer[peer] >= quota:
            continue
        taken = entry if accept is None else accept(entry)
        if taken is None:
            continue
        picked.append(taken)
        per_peer[peer] += 1
        if len(picked) == k:
            break
    return picked
