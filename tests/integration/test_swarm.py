"""A whole swarm through real processes: two nodes, each its generator, sampler and trainer as
separate processes that talk only through the broker, started by the `sapo swarm` launcher."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sapo.checkpoints import CheckpointStore
from sapo.kafka import Disposition, Record
from sapo.swarm.history import read_rows
from sapo.swarm.manifest import parse_manifest
from sapo.swarm.run import run_swarm
from sapo.topics import TopicNames
from sapo.v1 import rollout_pb2
from sapo.wire import decode
from tests.integration.kafka_helpers import make_loop

pytestmark = pytest.mark.integration
ROUNDS = 3


def _groups(bootstrap: str, topic: str, count: int) -> list[rollout_pb2.RolloutGroup]:
    out: list[rollout_pb2.RolloutGroup] = []

    def collect(record: Record) -> Disposition:
        out.append(decode(rollout_pb2.RolloutGroup, record.value, 1 << 24))
        return Disposition.DONE

    loop, _, _ = make_loop(bootstrap, f"{topic}.check", [topic], collect)
    loop.run(max_records=count, idle_timeout_s=20)
    return out


def test_two_node_lockstep_swarm_runs_end_to_end(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, s3_url: str
) -> None:
    """node-b keeps its checkpoints in an object store (`store`: moto's S3 on loopback, credentials
    from the environment the launcher hands on): its generator hot-reloads every version from there."""
    manifest = parse_manifest(
        {
            "name": "it",
            "bootstrap": kafka_bootstrap,
            "topic_prefix": topic_prefix,
            "defaults": {
                "model": "tiny:1",
                "questions_per_round": 2,
                "completions_per_question": 2,
                "local_groups": 1,
                "external_groups": 1,
                "rounds": ROUNDS,
                "max_new_tokens": 8,
                "sampler": {"lockstep_timeout_s": 20},
            },
            "nodes": [
                {"id": "node-a", "seed": 1},
                {"id": "node-b", "seed": 2, "model": "tiny:2", "store": s3_url},
            ],
        }
    )
    out = io.StringIO()
    assert run_swarm(manifest, tmp_path, refresh_s=0.5, out=out) == 0, out.getvalue()

    for node in ("node-a", "node-b"):
        steps = read_rows(tmp_path / "steps" / f"{node}.jsonl")
        assert [s["version"] for s in steps] == list(range(1, ROUNDS + 1))
        assert [s["batch_id"] for s in steps] == [f"{node}/{i}" for i in range(ROUNDS)]
        # Lock-step: round r is sampled with policy version r, so every announced version was loaded.
        groups = _groups(kafka_bootstrap, TopicNames.for_node(node, topic_prefix).rollouts, ROUNDS * 2)
        assert sorted((g.round, g.policy_version) for g in groups) == [
            (r, r) for r in range(ROUNDS) for _ in (0, 1)
        ]
        # The launcher puts every node's model calls behind the machine's one compute gate.
        for service in ("trainer", "generator"):
            log_text = (tmp_path / "logs" / f"{node}-{service}.log").read_text()
            assert f"compute gate {tmp_path / 'gate'}" in log_text
        # The on-policy record: one row per round, each the mean of every completion the node sampled.
        rounds = read_rows(tmp_path / "rounds" / f"{node}.jsonl")
        assert [(r["round"], r["policy_version"], r["groups"]) for r in rounds] == [
            (r, r, 2) for r in range(ROUNDS)
        ]
        by_round = {
            r: [c.reward for g in groups if g.round == r for c in g.completions] for r in range(ROUNDS)
        }
        assert [r["reward_mean"] for r in rounds] == pytest.approx(
            [sum(v) / len(v) for _, v in sorted(by_round.items())]
        )
    assert "node-a" in out.getvalue()
    assert CheckpointStore(tmp_path / "checkpoints").versions("node-a")[-1] == ROUNDS
    assert CheckpointStore(s3_url).versions("node-b")[-1] == ROUNDS
    assert not (tmp_path / "checkpoints" / "node-b").exists()
