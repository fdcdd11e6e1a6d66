"""Bounded memory of the group ids a node has already pooled or trained on (the dedupe step).

At-least-once delivery re-sends groups after a crash and peers may publish a group twice; the group
id is the idempotency key. The set holds ids in insertion order and forgets the oldest beyond its
capacity, so memory stays bounded. Forgetting is safe when the capacity covers every group that can
still pass the age and staleness bounds: an older copy is rejected by those filters anyway.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class SeenGroups:
    """An insertion-ordered set of group ids with a capacity (oldest evicted first)."""

    def __init__(self, capacity: int, ids: Iterable[str] = ()) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        for group_id in ids:
            self.add(group_id)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, group_id: str) -> None:
        self._ids[group_id] = None
        self._ids.move_to_end(group_id)
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def discard(self, group_id: str) -> None:
        """Forget an id whose group left the pool without being used (partition revoked): its next
        delivery must be accepted again."""
        self._ids.pop(group_id, None)
