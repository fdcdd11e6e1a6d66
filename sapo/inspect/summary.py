"""Summary mode: counts, rates and payload sizes of the entries read, per topic, node, task, type and
dead-letter reason.

Rates come from the records' own timestamps (the producers' CreateTime), not from when they were read,
so a topic read hours later reports the rate at which it was written: `(count - 1) / (last - first)`,
the mean inter-arrival rate; None for fewer than two records or an empty time span. Percentiles are
`statistics.quantiles` with the inclusive method (interpolated between the observed sizes); every
size is kept, which bounds a summary at some tens of bytes per record read.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sapo.inspect.decode import Entry

#: The groupings a summary reports, in order: name -> keys of an entry in that grouping.
GROUPINGS: Final = ("topic", "type", "node", "task", "dlq_reason")
PERCENTILES: Final = (50, 90, 99)


def _keys(entry: Entry, grouping: str) -> Iterable[str]:
    if grouping == "task":
        return entry.tasks or ("",)
    if grouping == "dlq_reason":
        return (entry.dlq_reason,) if entry.dlq_reason else ()
    value: str = getattr(entry, grouping)
    return (value,)


def percentiles(sizes: list[int]) -> dict[int, float]:
    """p50, p90, p99 of `sizes` (empty dict for no sizes)."""
    if not sizes:
        return {}
    if len(sizes) == 1:
        return dict.fromkeys(PERCENTILES, float(sizes[0]))
    cuts = statistics.quantiles(sizes, n=100, method="inclusive")
    return {p: cuts[p - 1] for p in PERCENTILES}


@dataclass
class Tally:
    """Count, bytes, time span and sizes of the entries of one key."""

    count: int = 0
    bytes: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    sizes: list[int] = field(default_factory=list)

    def add(self, entry: Entry) -> None:
        self.count += 1
        self.bytes += entry.size
        self.sizes.append(entry.size)
        if entry.timestamp_ms > 0:
            ts = entry.timestamp_ms
            self.first_ms = ts if self.first_ms is None else min(self.first_ms, ts)
            self.last_ms = ts if self.last_ms is None else max(self.last_ms, ts)

    @property
    def rate_per_s(self) -> float | None:
        if self.count < 2 or self.first_ms is None or self.last_ms is None or self.last_ms == self.first_ms:
            return None
        return (self.count - 1) / ((self.last_ms - self.first_ms) / 1000)

    def as_dict(self) -> dict[str, Any]:
        rate = self.rate_per_s
        return {
            "messages": self.count,
            "bytes": self.bytes,
            "rate_per_s": rate,
            "bytes_per_s": None if rate is None else rate * self.bytes / self.count,
            **{f"size_p{p}": value for p, value in percentiles(self.sizes).items()},
            "size_max": max(self.sizes, default=0),
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
        }


@dataclass
class Summary:
    """Tallies per key of every grouping, plus how many entries did not decode."""

    tallies: dict[str, dict[str, Tally]] = field(default_factory=lambda: {g: {} for g in GROUPINGS})
    undecodable: int = 0

    def add(self, entry: Entry) -> None:
        if entry.error:
            self.undecodable += 1
        for grouping in GROUPINGS:
            for key in _keys(entry, grouping):
                self.tallies[grouping].setdefault(key, Tally()).add(entry)

    @property
    def messages(self) -> int:
        return sum(t.count for t in self.tallies["topic"].values())

    def rows(self, grouping: str) -> list[tuple[str, Tally]]:
        """The grouping's keys, most messages first (then by key)."""
        return sorted(self.tallies[grouping].items(), key=lambda kv: (-kv[1].count, kv[0]))

    def as_dict(self) -> dict[str, Any]:
        groups: Mapping[str, list[dict[str, Any]]] = {
            grouping: [{grouping: key, **tally.as_dict()} for key, tally in self.rows(grouping)]
            for grouping in GROUPINGS
        }
        return {"messages": self.messages, "undecodable": self.undecodable, **groups}
