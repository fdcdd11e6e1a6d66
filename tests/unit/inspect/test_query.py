"""Filters: ranges as operators write them, and every set criterion must hold."""

from __future__ import annotations

import pytest

from sapo.inspect.decode import Entry
from sapo.inspect.query import Filter, IntRange

pytestmark = pytest.mark.unit


def entry(**fields: object) -> Entry:
    base: dict[str, object] = {
        "topic": "t",
        "partition": 0,
        "offset": 0,
        "timestamp_ms": 0,
        "key": "",
        "size": 1,
    }
    return Entry(**(base | {"type": "RolloutGroup"} | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [("5", 5, 5), ("3..7", 3, 7), ("3..", 3, None), ("..7", None, 7), (" 12 ", 12, 12), ("0..0", 0, 0)],
)
def test_ranges(text: str, low: int | None, high: int | None) -> None:
    assert IntRange.parse(text) == IntRange(low, high)


@pytest.mark.parametrize("text", ["", "..", "a", "3..x", "-1", "7..3", "1...2"])
def test_bad_ranges_say_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match="range"):
        IntRange.parse(text)


def test_membership() -> None:
    assert 4 in IntRange(3, None)
    assert 2 not in IntRange(3, None)
    assert 8 not in IntRange(None, 7)
    assert None not in IntRange(None, None)


def test_every_criterion_must_hold_and_missing_facts_never_match() -> None:
    e = entry(node="node-1", tasks=("a", "b"), round=3, policy_version=2, dlq_reason="stale")
    assert Filter().matches(e)
    assert Filter(nodes=frozenset({"node-0", "node-1"}), tasks=frozenset({"b"})).matches(e)
    assert not Filter(nodes=frozenset({"node-0"})).matches(e)
    assert not Filter(tasks=frozenset({"c"})).matches(e)
    assert Filter(rounds=IntRange(3, 3), versions=IntRange(None, 2)).matches(e)
    assert not Filter(rounds=IntRange(4, None)).matches(e)
    assert Filter(reasons=frozenset({"stale"})).matches(e)
    assert not Filter(reasons=frozenset({"oversized"})).matches(e)
    undecoded = entry(error="undecodable")
    assert not Filter(rounds=IntRange(0, None)).matches(undecoded)
    assert not Filter(versions=IntRange(None, None)).matches(undecoded)
    assert not Filter(reasons=frozenset({"stale"})).matches(undecoded)
