"""Contribution accounting through real processes: a two-node swarm started by the `sapo swarm`
launcher, whose step records name the peer whose groups each node trained on (and carry the
sampler's per-peer intake, through the batch), and whose services' /metrics carry per-peer series
with a bounded `peer` label; `sapo report` reads the run directory.

Untrained tiny models score 0 everywhere, so no group would have signal and no peer would ever be
trained on: the nodes are the warm models of `test_swarm_hetero` (one family here), built once into
sapo's cache before the swarm starts. node-b sets METRICS_PEERS=0, so its peer is counted only under
the aggregate label.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from sapo import cli
from sapo.node.peers import OTHER
from sapo.swarm.history import read_rows
from sapo.swarm.progress import Samples, scrape
from sapo.swarm.report import contribution_totals
from sapo.swarm.run import run_swarm
from tests.integration.warm_swarm import warm_swarm

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
ROUNDS = 2
PEER = {"node-a": "node-b", "node-b": "node-a"}


class Scraper(threading.Thread):
    """Keeps the last /metrics of every service of the run, found through the launcher's port files."""

    def __init__(self, ports: Path) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.last: dict[str, Samples] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for port_file in self.ports.glob("*"):
                try:
                    port = int(port_file.read_text())
                except ValueError:  # being written
                    continue
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
                if samples:
                    self.last[port_file.stem] = samples


def _values(samples: Samples, name: str) -> dict[str, float]:
    """peer label -> value (summed over other labels)."""
    out: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        peer = labels.get("peer", "")
        out[peer] = out.get(peer, 0.0) + value
    return out


def test_steps_and_metrics_account_for_each_peers_groups(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = warm_swarm(
        "it-contrib",
        kafka_bootstrap,
        topic_prefix,
        ROUNDS,
        [
            {"id": "node-a", "seed": 1},
            {"id": "node-b", "seed": 2, "sampler": {"metrics_peers": 0}, "trainer": {"metrics_peers": 0}},
        ],
        local_groups=2,
        external_groups=2,
        sampler={"lockstep_timeout_s": 120},
    )
    run_dir = tmp_path / "run"
    scraper = Scraper(run_dir / "ports")
    scraper.start()
    out = io.StringIO()
    try:
        assert run_swarm(manifest, run_dir, refresh_s=0.5, out=out) == 0, out.getvalue()
    finally:
        scraper.stop.set()
        scraper.join()

    for node, peer in PEER.items():
        steps = read_rows(run_dir / "steps" / f"{node}.jsonl")
        assert [s["version"] for s in steps] == list(range(1, ROUNDS + 1))
        for step in steps:
            contributions = {c["node"]: c for c in step["contributions"]}
            assert set(contributions) <= {node, peer}
            assert sum(c["completion_tokens"] for c in contributions.values()) == step["completion_tokens"]
            assert sum(c["completions"] for c in contributions.values()) == (
                step["local_completions"] + step["external_completions"]
            )
            intake = {i["node"]: i for i in step["intake"]}  # the sampler's side, via the batch
            assert set(intake) <= {peer}
            if step["external_completions"]:
                assert contributions[peer]["completion_tokens"] > 0
                assert intake[peer]["used"] >= contributions[peer]["groups"] >= 1
        trained_peer = [s for s in steps if s["external_completions"]]
        assert trained_peer, f"{node} trained on none of {peer}'s groups"
        assert sum(i["received"] for s in steps for i in s["intake"]) > 0

        sampler, trainer = scraper.last[f"{node}-sampler"], scraper.last[f"{node}-trainer"]
        labelled = node == "node-a"  # node-b has METRICS_PEERS=0: its peer is only under OTHER
        peer_label = peer if labelled else OTHER
        received = _values(sampler, "sapo_sampler_peer_groups_received_total")
        used = _values(sampler, "sapo_sampler_peer_groups_used_total")
        tokens = _values(trainer, "sapo_trainer_peer_completion_tokens_total")
        assert set(received) == set(used) == ({peer, OTHER} if labelled else {OTHER})
        assert received[peer_label] >= used[peer_label] > 0
        assert set(tokens) == ({node, peer, OTHER} if labelled else {node, OTHER})
        assert tokens[peer_label] == sum(
            c["completion_tokens"] for s in steps for c in s["contributions"] if c["node"] == peer
        )
        rejected = sampler.get("sapo_sampler_peer_groups_rejected_total", [])
        assert {labels["peer"] for labels, _ in rejected} <= {peer_label, OTHER}

    totals = {(t.trainer, t.source): t for t in contribution_totals(run_dir)}
    assert totals[("node-a", "node-b")].completion_tokens > 0
    assert cli.main(["report", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert "node-a (own)" in printed and "what each node's sampler did" in printed
    assert (run_dir / "contributions.png").exists()
