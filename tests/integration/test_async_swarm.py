"""A two-node async swarm through real processes, with groups that have signal.

Two nodes, so each has one peer, and that peer can give at most `max_per_source` (2) groups to a
batch of J = 4 external slots. A streaming batch must not wait for the two slots nobody can fill: it
waits for what the expected peers can give, then fills the rest from local groups
(`sapo.sampler.assembler`). Before that rule, this swarm trained its first version or two, then
stalled for good.

Untrained tiny models score 0 everywhere, so their groups have no signal, nothing is pooled, and
their batches come from the starvation rule instead. The nodes are warm models
(`tests.integration.warm_swarm`).

A bounded async run also needs local groups for its last batches: a batch that fills external slots
from local uses more than a round's worth, so the trainer plans up to `max_ahead` rounds past the
run's last version (`sapo.generator.work.Pacing.last_round`). Before that, one run in four or five
of this test left a node one version short, waiting for a round nobody would generate.
"""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

from sapo.swarm.history import read_rows
from sapo.swarm.run import run_swarm
from tests.integration.warm_swarm import warm_swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ROUNDS = 3
PEER = {"node-a": "node-b", "node-b": "node-a"}
MAX_PER_SOURCE = 2
CAP_S = 300.0
"""A stalled swarm never returns: after this long the run is interrupted as by Ctrl-C."""
TIMEOUT_S = 20.0
"""The async wait for the swarm. A batch that waits for groups nobody can send goes after it with a
warning: a node whose every batch did so waited for slots nobody can fill (the rule in the module
docstring). Its last batch may, when its peer finished first without groups to spare."""


def test_an_async_swarm_of_two_nodes_trains_every_round_on_what_its_peer_can_give(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    manifest = warm_swarm(
        "it-async",
        kafka_bootstrap,
        topic_prefix,
        ROUNDS,
        [{"id": "node-a", "seed": 1}, {"id": "node-b", "seed": 2}],
        local_groups=1,  # a batch rarely starves (no group of a round with signal)
        external_groups=4,
        round_mode="async",
        trainer={"max_ahead": 1},
        sampler={"max_per_source": MAX_PER_SOURCE, "async_timeout_s": TIMEOUT_S},
    )
    out = io.StringIO()
    timer = threading.Timer(CAP_S, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        code = run_swarm(manifest, tmp_path, refresh_s=0.5, out=out)
    finally:
        timer.cancel()
    assert code == 0, f"the swarm did not finish within {CAP_S:.0f} s (exit {code}):\n{out.getvalue()}"

    for node, peer in PEER.items():
        steps = read_rows(tmp_path / "steps" / f"{node}.jsonl")
        # A node that reached its target trains on while its peer catches up: at least ROUNDS versions.
        assert [s["version"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= ROUNDS
        from_peer = []
        for step in steps:
            groups = {c["node"]: c["groups"] for c in step["contributions"]}
            assert set(groups) <= {node, peer}
            assert groups.get(peer, 0) <= MAX_PER_SOURCE
            from_peer.append(groups.get(peer, 0))
        assert any(from_peer), f"{node} trained on none of {peer}'s groups: {from_peer}"
        timed_out = (tmp_path / "logs" / f"{node}-sampler.log").read_text().count(" s (async_timeout_s)")
        assert timed_out <= 1, f"{node}: {timed_out} of {len(steps)} batches waited out the timeout"
