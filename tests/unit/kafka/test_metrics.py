"""`LoopCounter` is exposed as the `Counter` it replaces; the loops' gauges add up every open loop."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sapo.kafka.metrics import LoopCounter, TransportMetrics

pytestmark = pytest.mark.unit


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        if family.name == name
        for s in family.samples
    }


def test_a_loop_counter_reads_as_the_prometheus_counter_it_replaces() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop_counter = LoopCounter("demo_total", "Demo.", ["stream", "reason"], ours)
    counter = Counter("demo_total", "Demo.", ["stream", "reason"], registry=theirs)
    loop_counter.labels("external", "stale")  # declared at zero
    counter.labels("external", "stale")
    for _ in range(3):
        loop_counter.inc("local", "stale")
        counter.labels("local", "stale").inc()
    ours_text, theirs_text = generate_latest(ours).decode(), generate_latest(theirs).decode()
    assert 'demo_total{reason="stale",stream="local"} 3.0' in ours_text
    assert ours_text.splitlines()[:2] == theirs_text.splitlines()[:2]  # HELP and TYPE
    mine, reference = _samples(ours, "demo"), _samples(theirs, "demo")
    assert mine.keys() == reference.keys()  # _total and _created for both series
    assert {k: v for k, v in mine.items() if k[0] == "demo_total"} == {
        k: v for k, v in reference.items() if k[0] == "demo_total"
    }


def test_a_loop_counter_checks_its_label_values_and_names() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("demo_total", "Demo.", ["stream"], registry)
    with pytest.raises(ValueError, match="stream"):
        counter.inc("local", "extra")
    with pytest.raises(ValueError):
        counter.labels()
    with pytest.raises(ValueError):  # the registry refuses a second metric of the same name
        LoopCounter("demo_total", "Again.", ["stream"], registry)
    counter.inc("local")
    assert registry.get_sample_value("demo_total", {"stream": "local"}) == 1
    assert registry.get_sample_value("demo_total", {"stream": "remote"}) is None  # never declared


class _Loop:
    def __init__(self, pending: int, assigned: int) -> None:
        self.pending = pending
        self.assigned = {("t", p) for p in range(assigned)}

    def pending_count(self) -> int:
        return self.pending


def test_pending_and_assigned_add_up_the_open_loops_of_a_service() -> None:
    registry = CollectorRegistry()
    metrics = TransportMetrics(registry, "demo")
    swarm, local = _Loop(5, 2), _Loop(1, 1)
    metrics.track(swarm)
    metrics.track(local)
    swarm.pending = 7  # read when scraped, never set per record
    assert registry.get_sample_value("sapo_demo_messages_pending") == 8
    assert registry.get_sample_value("sapo_demo_assigned_partitions") == 3
    metrics.untrack(swarm)
    metrics.untrack(swarm)  # closing twice is harmless
    assert registry.get_sample_value("sapo_demo_messages_pending") == 1
    assert registry.get_sample_value("sapo_demo_assigned_partitions") == 1
