"""Which entries to show: filters by node, task, round, policy version and dead-letter reason.

Every criterion that is set must hold; within one criterion any listed value matches. An entry that
lacks the attribute a criterion asks about (a payload that did not decode has no round) does not
match it, so a filter never lets an unknown through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sapo.inspect.decode import Entry

_RANGE_RE: Final = re.compile(r"^(\d*)(\.\.)?(\d*)$")


@dataclass(frozen=True)
class IntRange:
    """Inclusive bounds; None = open on that side. Written `5`, `3..7`, `3..` or `..7`."""

    low: int | None
    high: int | None

    @classmethod
    def parse(cls, text: str) -> IntRange:
        match = _RANGE_RE.match(text.strip())
        if match is None or not (match.group(1) or match.group(3)):
            raise ValueError(f"{text!r} is not a number or a range (5, 3..7, 3.., ..7)")
        low, dots, high = match.groups()
        if not dots:
            return cls(int(low), int(low))
        bounds = cls(int(low) if low else None, int(high) if high else None)
        if bounds.low is not None and bounds.high is not None and bounds.low > bounds.high:
            raise ValueError(f"empty range {text!r}: the low end is above the high end")
        return bounds

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


@dataclass(frozen=True)
class Filter:
    """What to keep. Empty sets and None ranges do not filter."""

    nodes: frozenset[str] = frozenset()
    tasks: frozenset[str] = frozenset()
    rounds: IntRange | None = None
    versions: IntRange | None = None
    reasons: frozenset[str] = frozenset()

    def matches(self, entry: Entry) -> bool:
        return (
            (not self.nodes or entry.node in self.nodes)
            and (not self.tasks or not self.tasks.isdisjoint(entry.tasks))
            and (self.rounds is None or entry.round in self.rounds)
            and (self.versions is None or entry.policy_version in self.versions)
            and (not self.reasons or entry.dlq_reason in self.reasons)
        )
