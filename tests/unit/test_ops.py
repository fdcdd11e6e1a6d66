"""The ops server: real HTTP on loopback, real Prometheus text."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

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
