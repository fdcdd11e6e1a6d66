"""The local swarm's progress view reads only the metrics it shows, from a real /metrics endpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
    start_http_server,
)

from sapo.ops import Health, OpsServer
from sapo.swarm.progress import NodeStatus, scrape


def _everything_server(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """A service that ignores `name[]` and always answers with its whole exposition."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture(params=["ops", "prometheus_client", "ignores-name-filter"])
def service(request: pytest.FixtureRequest) -> Iterator[str]:
    """A generator/sampler/trainer's worth of metrics, with a label value holding braces and spaces,
    served by our ops server, by prometheus_client's, and by one that ignores the `name[]` filter."""
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
    if request.param == "ops":
        ops = OpsServer(registry, Health(), host="127.0.0.1", port=0).start()
        try:
            yield f"http://127.0.0.1:{ops.port}/metrics"
        finally:
            ops.stop()
        return
    if request.param == "prometheus_client":
        server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        try:
            yield f"http://127.0.0.1:{server.server_port}/metrics"
        finally:
            server.shutdown()
            thread.join(5)
        return
    plain = _everything_server(registry)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{plain.server_port}/metrics"
    finally:
        plain.shutdown()
        plain.server_close()


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
