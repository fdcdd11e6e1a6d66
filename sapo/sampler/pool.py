"""Accepted groups waiting for a batch: per origin, in arrival order, bounded, shared fairly between
peers (`sapo.sampler.fairness`; the node's own groups are an origin of their own, so the swarm never
evicts them).

Expiry looks only at what expired: each origin keeps a heap of its entries by the value that ages
them (an external group's completion time, a local group's policy version), and entries that left the
pool otherwise are dropped from it when they surface (the heap is rebuilt when they outnumber the
pooled ones), so a batch never scans the whole pool.

Each entry carries an opaque `handle` (the consumed record, in the service) so that whoever takes an
entry out, into a batch or into the bin, can finish its input offset. The pool never finishes
anything itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, NamedTuple, TypeVar

from sapo.sampler.fairness import Admission, admission
from sapo.sampler.screen import ORIGINS, Origin, Scored

H = TypeVar("H")


class Entry(NamedTuple, Generic[H]):
    """One pooled group and the handle of the message it came in. A named tuple, as `Scored`."""

    scored: Scored
    handle: H
    pooled_s: float

    @property
    def group_id(self) -> str:
        return self.scored.group_id


class _Shares:
    """Groups per peer, and the largest holder, kept up to date in constant time per change."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._holders: dict[int, dict[str, None]] = {}  # count -> peers holding that many, in order
        self.largest = 0

    def _move(self, peer: str, old: int, new: int) -> None:
        if old:
            holders = self._holders[old]
            del holders[peer]
            if not holders:
                del self._holders[old]
        if new:
            self.counts[peer] = new
            self._holders.setdefault(new, {})[peer] = None
        else:
            del self.counts[peer]
        if new > self.largest:
            self.largest = new
        elif old == self.largest and old not in self._holders:
            self.largest = new  # counts move by one, so the peer that just left `old` is the new max

    def add(self, peer: str) -> None:
        count = self.counts.get(peer, 0)
        self._move(peer, count, count + 1)

    def remove(self, peer: str) -> None:
        count = self.counts[peer]
        self._move(peer, count, count - 1)

    def a_largest(self) -> str:
        """The peer that reached the largest count first."""
        return next(iter(self._holders[self.largest]))


def age_key(scored: Scored) -> float:
    """What ages a pooled group: its completion time (external) or its policy version (local)."""
    return scored.completed_s if scored.origin == "external" else float(scored.group.policy_version)


class Pool(Generic[H]):
    """Groups by origin in arrival order, at most `max_per_origin` per origin, shared fairly between
    peers (`sapo.sampler.fairness`): a full origin admits a group only in place of another."""

    def __init__(self, max_per_origin: int) -> None:
        if max_per_origin < 1:
            raise ValueError(f"max_per_origin must be >= 1, got {max_per_origin}")
        self._max = max_per_origin
        # Plain dicts keep insertion order too, and a batch copies one whole (`entries`) far faster than
        # an OrderedDict of thousands, whose values are found key by key. A peer's own entries stay an
        # OrderedDict: its oldest is taken from the front on every eviction, in O(1) however many of
        # its groups left before (a plain dict walks past their holes).
        self._entries: dict[Origin, dict[str, Entry[H]]] = {o: {} for o in ORIGINS}
        self._by_peer: dict[Origin, dict[str, OrderedDict[str, Entry[H]]]] = {o: {} for o in ORIGINS}
        self._shares: dict[Origin, _Shares] = {o: _Shares() for o in ORIGINS}
        self._ages: dict[Origin, list[tuple[float, int, str]]] = {o: [] for o in ORIGINS}
        self._tiebreak = itertools.count()  # equal ages leave in arrival order

    def admission(self, origin: Origin, peer: str) -> Admission:
        """What adding a group of `peer` would do now (`sapo.sampler.fairness.admission`)."""
        shares = self._shares[origin]
        total = len(self._entries[origin])
        return admission(shares.counts.get(peer, 0), shares.largest, total, self._max)

    def add(self, entry: Entry[H], verdict: Admission | None = None) -> Entry[H] | None:
        """Pool the entry, in place of the group fairness evicts for it (returned); the caller checks
        `admission` first (and may pass what it answered: nothing changed the pool since): a refused
        entry raises ValueError."""
        scored = entry.scored
        origin, peer, group_id = scored.origin, scored.peer, scored.group_id
        verdict = verdict or self.admission(origin, peer)
        evicted = None
        if verdict is Admission.REFUSE:
            raise ValueError(f"group {group_id} of {peer} has no place in the full {origin} pool")
        by_peer = self._by_peer[origin]
        if verdict is not Admission.ROOM:
            victim = peer if verdict is Admission.REPLACE_OWN else self._shares[origin].a_largest()
            evicted = next(iter(by_peer[victim].values()))
            self.remove([evicted])
        pooled = self._entries[origin]
        pooled[group_id] = entry
        own = by_peer.get(peer)
        if own is None:
            own = by_peer[peer] = OrderedDict()
        own[group_id] = entry
        self._shares[origin].add(peer)
        ages = self._ages[origin]
        heapq.heappush(ages, (age_key(scored), next(self._tiebreak), group_id))
        if len(ages) > 2 * len(pooled) + 64:  # mostly entries that left otherwise
            ages[:] = [item for item in ages if item[2] in pooled]
            heapq.heapify(ages)
        return evicted

    def remove(self, entries: Iterable[Entry[H]]) -> None:
        for entry in entries:
            origin, peer = entry.scored.origin, entry.scored.peer
            if self._entries[origin].pop(entry.group_id, None) is None:
                continue
            own = self._by_peer[origin][peer]
            del own[entry.group_id]
            if not own:
                del self._by_peer[origin][peer]
            self._shares[origin].remove(peer)

    def replace(self, entry: Entry[H]) -> None:
        """Swap a pooled entry for another of the same group (its verified form), in its place."""
        origin = entry.scored.origin
        if entry.group_id in self._entries[origin]:
            self._entries[origin][entry.group_id] = entry
            self._by_peer[origin][entry.scored.peer][entry.group_id] = entry

    def take_where(self, keep_out: Callable[[Entry[H]], bool]) -> list[Entry[H]]:
        """Remove and return every entry for which `keep_out` is true."""
        out = [e for o in ORIGINS for e in self._entries[o].values() if keep_out(e)]
        self.remove(out)
        return out

    def take_aged(self, origin: Origin, below: float) -> list[Entry[H]]:
        """Remove and return the origin's entries whose `age_key` is below `below`, oldest first."""
        ages, pooled = self._ages[origin], self._entries[origin]
        out: list[Entry[H]] = []
        while ages and ages[0][0] < below:
            group_id = heapq.heappop(ages)[2]
            entry = pooled.get(group_id)
            if entry is not None and age_key(entry.scored) < below:
                self.remove([entry])  # now, so that a stale heap item of a group re-added finds it gone
                out.append(entry)
        return out

    def entries(self, origin: Origin) -> list[Entry[H]]:
        """The origin's entries, oldest first."""
        return list(self._entries[origin].values())

    def oldest(self, origin: Origin, count: int) -> list[Entry[H]]:
        out: list[Entry[H]] = []
        for entry in self._entries[origin].values():
            if len(out) >= count:
                break
            out.append(entry)
        return out

    def count(self, origin: Origin) -> int:
        return len(self._entries[origin])

    def peer_counts(self) -> Iterable[int]:
        """How many external groups each peer has in the pool."""
        return self._shares["external"].counts.values()
