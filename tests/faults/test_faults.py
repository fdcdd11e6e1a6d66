"""Fault injection: services SIGKILLed and the broker killed with -9 while nodes train, then every group
and batch accounted for (see tests/faults/chaos.py for the driver, tests/faults/ledger.py for the
accounting).

The default suite runs the short version: one node, a handful of rounds, each service killed at least
once and the broker restarted twice. `make soak` runs the long one: more rounds, a 3-node swarm, faults
drawn until the end (`SAPO_SOAK_ROUNDS`, `SAPO_SOAK_SEED`, `SAPO_SOAK_REPORT` set it up).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.chaos import ChaosPlan, Driver
from tests.s3 import S3Server

pytestmark = [pytest.mark.integration, pytest.mark.faults]
SOAK = os.environ.get("SAPO_SOAK") == "1"


def _run(plan: ChaosPlan, tmp_path: Path, s3: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env.items():  # this process reads the checkpoints back from the store
        monkeypatch.setenv(name, value)
    result = Driver(plan, tmp_path / "run", s3, prefix).run()
    print("\n" + result.report() + "\n  " + "\n  ".join(result.faults.events))
    report_dir = os.environ.get("SAPO_SOAK_REPORT")
    if report_dir:
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        name = f"faults-{plan.nodes}-node-seed-{plan.seed}"
        (out / f"{name}.json").write_text(result.to_json() + "\n")
        (out / f"{name}.txt").write_text(result.report() + "\n")
    assert sum(result.faults.kills.values()) >= 3 and result.faults.broker_restarts >= 2, result.faults.events
    assert not result.failures(), "\n".join(result.failures() + result.faults.events)


def _plan(nodes: int, short_rounds: int) -> ChaosPlan:
    model = "tiny:1" if nodes == 1 else "warm-bpe:0"
    if not SOAK:
        return ChaosPlan(nodes, short_rounds, model, seed=int(os.environ.get("SAPO_SOAK_SEED", "0")))
    return ChaosPlan(
        nodes=nodes,
        model=model,
        rounds=int(os.environ.get("SAPO_SOAK_ROUNDS", "40")),
        seed=int(os.environ.get("SAPO_SOAK_SEED", "1")),
        deadline_s=float(os.environ.get("SAPO_SOAK_DEADLINE_S", "5400")),
    )


@pytest.mark.timeout(1200)
def test_a_node_loses_nothing_while_its_services_and_the_broker_are_killed(
    s3_server: S3Server, topic_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(_plan(1, short_rounds=8), tmp_path, s3_server, topic_prefix, monkeypatch)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_a_three_node_swarm_loses_nothing_while_services_and_the_broker_are_killed(
    s3_server: S3Server, topic_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(_plan(3, short_rounds=8), tmp_path, s3_server, topic_prefix, monkeypatch)
