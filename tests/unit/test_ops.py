"""The ops server: real HTTP on loopback, real Prometheus text."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from sapo.ops import Health, OpsServer

pytestmark = pytest.mark.unit


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_metrics_health_and_readiness() -> None:
    registry = CollectorRegistry()
    Counter("sapo_demo_things_total", "Things.", registry=registry).inc(3)
    health = Health(max_silence_s=60)
    health.require("model_loaded", "partitions_assigned")
    server = OpsServer(registry, health, host="127.0.0.1", port=0).start()
    try:
        status, body = _get(server.port, "/metrics")
        assert status == 200
        assert "sapo_demo_things_total 3.0" in body
        assert _get(server.port, "/healthz")[0] == 200
        status, body = _get(server.port, "/readyz")
        assert status == 503
        assert "model_loaded" in body
        health.set("model_loaded", True)
        health.set("partitions_assigned", True)
        assert _get(server.port, "/readyz") == (200, "ready\n")
        health.set_max_silence(-1)
        assert _get(server.port, "/healthz")[0] == 503
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.stop()


def test_metrics_name_filter_selects_series_by_sample_name() -> None:
    registry = CollectorRegistry()
    Counter("sapo_demo_things", "Things.", registry=registry).inc(3)
    Counter("sapo_demo_other", "Other.", registry=registry).inc(1)
    Histogram("sapo_demo_seconds", "Seconds.", registry=registry).observe(0.5)
    server = OpsServer(registry, Health(), host="127.0.0.1", port=0).start()
    try:
        whole = _get(server.port, "/metrics")[1]
        assert "sapo_demo_other_total 1.0" in whole and "sapo_demo_seconds_bucket" in whole
        query = "name[]=sapo_demo_things_total&name[]=sapo_demo_seconds_sum"
        status, body = _get(server.port, f"/metrics?{query}")
        assert status == 200
        samples = {line for line in body.splitlines() if line and not line.startswith("#")}
        assert samples == {"sapo_demo_things_total 3.0", "sapo_demo_seconds_sum 0.5"}
        status, body = _get(server.port, "/metrics?name[]=sapo_demo_missing")
        assert status == 200 and not [line for line in body.splitlines() if not line.startswith("#")]
    finally:
        server.stop()
