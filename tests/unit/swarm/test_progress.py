"""The local swarm's progress view reads only the metrics it shows, from a real /metrics endpoint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, start_http_server

from sapo.swarm.progress import NodeStatus, scrape


@pytest.fixture
def service() -> Iterator[str]:
    """A generator/sampler/trainer's worth of metrics, with a label value holding braces and spaces."""
    registry = CollectorRegistry()
    Counter("sapo_generator_groups", "groups", registry=registry).inc(12)
    Summary("sapo_generator_reward", "reward", registry=registry).observe(0.25)
    Gauge("sapo_trainer_announced_version", "version", registry=registry).set(3)
    Counter("sapo_trainer_steps", "steps", registry=registry).inc(3)
    used = Summary("sapo_sampler_batch_groups", "groups per batch", ["source"], registry=registry)
    used.labels(source="local").observe(4)
    used.labels(source="external").observe(4)
    rejected = Counter("sapo_sampler_groups_rejected", "rejected", ["reason"], registry=registry)
    rejected.labels(reason="no_signal {odd} label").inc(5)
    Histogram("sapo_trainer_step_seconds", "not shown", registry=registry).observe(1.5)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        thread.join(5)


def test_scraping_only_the_shown_metrics_reads_the_same_status(service: str) -> None:
    everything, shown = scrape(service), scrape(service, NodeStatus.METRICS)
    assert set(shown) == NodeStatus.METRICS
    hidden = "sapo_trainer_step_seconds_bucket"
    assert hidden in everything and hidden not in shown
    assert shown["sapo_sampler_groups_rejected_total"] == [({"reason": "no_signal {odd} label"}, 5.0)]
    status = NodeStatus.read("node-1", shown, shown, shown)
    assert status == NodeStatus.read("node-1", everything, everything, everything)
    assert (status.groups, status.policy_version, status.reward, status.local_used, status.rejected) == (
        12,
        3,
        0.25,
        4,
        5,
    )


def test_a_service_not_up_yet_reads_as_empty() -> None:
    assert scrape("http://127.0.0.1:9/metrics", NodeStatus.METRICS, timeout_s=1.0) == {}
