"""Summary numbers: counts per grouping, rates from record timestamps, size percentiles."""

from __future__ import annotations

import statistics

import pytest

from sapo.inspect.decode import Entry
from sapo.inspect.summary import Summary, Tally, percentiles

pytestmark = pytest.mark.unit


def entry(size: int, ts: int, **fields: object) -> Entry:
    base: dict[str, object] = {"topic": "sapo.swarm.rollouts", "partition": 0, "offset": 0, "key": ""}
    return Entry(**(base | {"timestamp_ms": ts, "size": size, "type": "RolloutGroup"} | fields))  # type: ignore[arg-type]


def test_percentiles_interpolate_between_observed_sizes() -> None:
    sizes = list(range(1, 101))
    assert percentiles(sizes) == {50: 50.5, 90: 90.1, 99: 99.01}
    assert percentiles([7]) == {50: 7.0, 90: 7.0, 99: 7.0}
    assert percentiles([]) == {}
    odd = [10, 400, 30, 2000]
    assert percentiles(odd)[50] == statistics.median(odd)


def test_rate_is_the_inter_arrival_rate_of_record_timestamps() -> None:
    tally = Tally()
    for i in range(5):
        tally.add(entry(100, 1_000_000 + 500 * i))  # one every 0.5 s
    assert tally.rate_per_s == pytest.approx(2.0)
    assert tally.as_dict()["bytes_per_s"] == pytest.approx(200.0)
    single = Tally()
    single.add(entry(100, 5))
    assert single.rate_per_s is None
    no_time = Tally()
    no_time.add(entry(1, 0))
    no_time.add(entry(1, 0))
    assert no_time.rate_per_s is None and no_time.first_ms is None


def test_groupings_count_nodes_tasks_types_and_dead_letter_reasons() -> None:
    summary = Summary()
    summary.add(entry(10, 1000, node="node-0", tasks=("a",)))
    summary.add(entry(20, 2000, node="node-0", tasks=("a", "b"), type="TrainingBatch"))
    summary.add(entry(30, 3000, node="node-1", tasks=("b",)))
    summary.add(entry(5, 4000, topic="sapo.node.node-0.dlq", dlq_reason="stale", error="undecodable"))
    counts = {g: {k: t.count for k, t in summary.rows(g)} for g in summary.tallies}
    assert counts["topic"] == {"sapo.swarm.rollouts": 3, "sapo.node.node-0.dlq": 1}
    assert counts["node"] == {"node-0": 2, "node-1": 1, "": 1}
    assert counts["task"] == {"a": 2, "b": 2, "": 1}
    assert counts["type"] == {"RolloutGroup": 3, "TrainingBatch": 1}
    assert counts["dlq_reason"] == {"stale": 1}
    data = summary.as_dict()
    assert (data["messages"], data["undecodable"]) == (4, 1)
    assert data["node"][0] == summary.tallies["node"]["node-0"].as_dict() | {"node": "node-0"}
    assert [row["node"] for row in data["node"]] == ["node-0", "", "node-1"]
