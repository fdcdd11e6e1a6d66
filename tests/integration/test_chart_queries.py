"""The chart's alert rules and Grafana dashboard against what real services export: a two-node swarm
of warm models (groups with signal, so every trainer and per-peer series is counted) started by the
`sapo swarm` launcher, every service's /metrics scraped through the run, and every query of the
rendered PrometheusRule and dashboard checked against the merged scrape (tests/deploy/queries.py):
each series it selects exists, each label it matches, groups, joins or prints is on it, and each
label value it compares with occurs. One undecodable record on node-a's rollouts topic gives the
dead-letter counters (at 0 from each start) a count.
"""

from __future__ import annotations

import io
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sapo.settings import ConsumerProfile
from sapo.swarm.run import run_swarm
from sapo.topics import TopicNames
from tests.deploy.helm import of_kind, render
from tests.deploy.queries import Scrape, mismatches
from tests.integration.raw_producer import produce_raw
from tests.integration.warm_swarm import warm_swarm

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


class Scraper(threading.Thread):
    """Merges every /metrics of every service of the run, found through the launcher's port files, and
    writes one undecodable record to node-a's rollouts topic once its sampler serves /metrics (the
    launcher has made the topics by then)."""

    def __init__(self, ports: Path, bootstrap: str, rollouts: str) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.bootstrap = bootstrap
        self.rollouts = rollouts
        self.scrape = Scrape()
        self.scraped: set[str] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        """What ended the thread early (a scrape the parser refused, a failed write), for the test."""

    def run(self) -> None:
        try:
            self._scrape_until_stopped()
        except BaseException as exc:
            self.error = exc

    def _scrape_until_stopped(self) -> None:
        while not self.stop.wait(1.0):
            for port_file in self.ports.glob("*"):
                try:
                    port = int(port_file.read_text())
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                        text = response.read().decode()
                except (ValueError, urllib.error.URLError, OSError):  # being written, or not up yet
                    continue
                self.scrape.add(text)
                if port_file.stem == "node-a-sampler" and port_file.stem not in self.scraped:
                    produce_raw(self.bootstrap, self.rollouts, b"k", b"\xff not a rollout group", [])
                self.scraped.add(port_file.stem)


def chart_queries() -> dict[str, tuple[str, str]]:
    """Every query of the rendered PrometheusRule and dashboard: where -> (expression, legend)."""
    docs = render(None, "prometheusRule.enabled=true", "grafanaDashboard.enabled=true")
    (rule,) = of_kind(docs, "PrometheusRule")
    found = {
        f"rule {r.get('alert') or r['record']}": (r["expr"], "")
        for group in rule["spec"]["groups"]
        for r in group["rules"]
    }
    (configmap,) = of_kind(docs, "ConfigMap")
    (text,) = configmap["data"].values()
    board = json.loads(text)
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found[f"dashboard variable {variable['name']}"] = (variable["definition"], "")
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target['refId']}"] = (
                target["expr"],
                target.get("legendFormat", ""),
            )
    return found


def test_every_alert_and_dashboard_query_reads_what_the_services_export(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    queries = chart_queries()  # first: without helm the test skips before the swarm runs
    manifest = warm_swarm(
        "it-chart",
        kafka_bootstrap,
        topic_prefix,
        2,
        [{"id": "node-a", "seed": 1}, {"id": "node-b", "seed": 2}],
        local_groups=2,
        external_groups=2,
        sampler={"lockstep_timeout_s": 120},
    )
    run_dir = tmp_path / "run"
    rollouts = TopicNames.for_node("node-a", topic_prefix).rollouts
    scraper = Scraper(run_dir / "ports", kafka_bootstrap, rollouts)
    scraper.start()
    # Statistics every second: the consumer-lag gauges appear within a short run's rounds.
    consumer = ConsumerProfile.local_swarm().model_copy(update={"statistics_interval_ms": 1000})
    out = io.StringIO()
    try:
        assert run_swarm(manifest, run_dir, refresh_s=0.5, out=out, consumer=consumer) == 0, out.getvalue()
    finally:
        scraper.stop.set()
        scraper.join()
    if scraper.error is not None:
        raise scraper.error

    services = {f"node-{n}-{s}" for n in "ab" for s in ("generator", "sampler", "trainer")}
    assert scraper.scraped == services
    problems = {
        where: found
        for where, (expr, legend) in queries.items()
        if (found := mismatches(expr, scraper.scrape, legend))
    }
    assert not problems, json.dumps(problems, indent=1)
