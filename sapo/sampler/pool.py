"""Accepted groups waiting for a batch: per origin, in arrival order, bounded.

Each entry carries an opaque `handle` (the consumed record, in the service) so that whoever takes an
entry out, into a batch or into the bin, can finish its input offset. The pool never finishes
anything itself.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sapo.sampler.screen import ORIGINS, Origin, Scored

H = TypeVar("H")


@dataclass(frozen=True)
class Entry(Generic[H]):
    """One pooled group and the handle of the message it came in."""

    scored: Scored
    handle: H
    pooled_s: float

    @property
    def group_id(self) -> str:
        return self.scored.group_id


class Pool(Generic[H]):
    """Groups by origin in arrival order; adding beyond `max_per_origin` evicts that origin's oldest."""

    def __init__(self, max_per_origin: int) -> None:
        if max_per_origin < 1:
            raise ValueError(f"max_per_origin must be >= 1, got {max_per_origin}")
        self._max = max_per_origin
        self._entries: dict[Origin, OrderedDict[str, Entry[H]]] = {o: OrderedDict() for o in ORIGINS}
        self._per_peer: Counter[str] = Counter()

    def add(self, entry: Entry[H]) -> Entry[H] | None:
        """Pool the entry; returns the entry evicted to make room, if any."""
        entries = self._entries[entry.scored.origin]
        entries[entry.group_id] = entry
        if entry.scored.origin == "external":
            self._per_peer[entry.scored.peer] += 1
        if len(entries) > self._max:
            oldest = next(iter(entries.values()))
            self.remove([oldest])
            return oldest
        return None

    def remove(self, entries: Iterable[Entry[H]]) -> None:
        for entry in entries:
            if self._entries[entry.scored.origin].pop(entry.group_id, None) is None:
                continue
            if entry.scored.origin == "external":
                peer = entry.scored.peer
                self._per_peer[peer] -= 1
                if self._per_peer[peer] == 0:
                    del self._per_peer[peer]

    def replace(self, entry: Entry[H]) -> None:
        """Swap a pooled entry for another of the same group (its verified form), in its place."""
        entries = self._entries[entry.scored.origin]
        if entry.group_id in entries:
            entries[entry.group_id] = entry

    def take_where(self, keep_out: Callable[[Entry[H]], bool]) -> list[Entry[H]]:
        """Remove and return every entry for which `keep_out` is true."""
        out = [e for o in ORIGINS for e in self._entries[o].values() if keep_out(e)]
        self.remove(out)
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
        return self._per_peer.values()
