"""`Children`: a labelled metric's children looked up once, counted in the metric's own series."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from sapo.kafka.metrics import Children

pytestmark = pytest.mark.unit


def test_children_are_the_metrics_own_series() -> None:
    registry = CollectorRegistry()
    counter = Counter("demo_total", "Demo.", ["stream", "reason"], registry=registry)
    gauge = Gauge("demo_pool", "Demo.", ["origin"], registry=registry)
    counted, pooled = Children(counter), Children(gauge)
    for _ in range(3):
        counted("local", "stale").inc()
    counted("external", "stale").inc(2)
    pooled("local").set(7)
    assert counted("local", "stale") is counter.labels("local", "stale")
    text = generate_latest(registry).decode()
    assert 'demo_total{reason="stale",stream="local"} 3.0' in text
    assert 'demo_total{reason="stale",stream="external"} 2.0' in text
    assert 'demo_pool{origin="local"} 7.0' in text


def test_children_check_label_values_as_the_metric_does() -> None:
    counted = Children(Counter("demo_total", "Demo.", ["stream"], registry=CollectorRegistry()))
    with pytest.raises(ValueError):
        counted("local", "extra")
