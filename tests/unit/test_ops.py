"""The ops server: real HTTP on loopback, real Prometheus text."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

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


def _switches(native_id: int) -> int:
    """Times the thread gave up or lost its CPU so far (Linux)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    counts = (line.split()[1] for line in status.splitlines() if line.split(":")[0].endswith("ctxt_switches"))
    return sum(int(count) for count in counts)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread switches from Linux's /proc")
def test_the_server_thread_sleeps_while_nobody_calls_and_stops_at_once() -> None:
    """No wake-ups at rest (every process of a node runs one), yet a stop ends the thread promptly and
    a second stop is harmless. The answer to a request can reach the client before the server thread
    is back asleep (a busy host may hold it off the CPU for a while): a quiet window within a few
    tries is what tells the two apart."""
    server = OpsServer(CollectorRegistry(), Health(), host="127.0.0.1", port=0).start()
    try:
        assert _get(server.port, "/healthz")[0] == 200
        threads = [t for t in threading.enumerate() if t.name == "ops-http"]
        ids = [t.native_id for t in threads if t.native_id is not None]
        quiet = False
        for _ in range(4):
            before = [_switches(i) for i in ids]
            time.sleep(1.5)  # serve_forever's poll would wake three times
            quiet = [_switches(i) for i in ids] == before
            if quiet:
                break
        assert ids and quiet
    finally:
        server.stop()
    assert len([t for t in threading.enumerate() if t.name == "ops-http"]) == len(threads) - 1
    server.stop()
    with pytest.raises(urllib.error.URLError):
        _get(server.port, "/healthz")


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
