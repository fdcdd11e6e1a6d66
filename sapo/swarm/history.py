"""The record of a swarm run on disk, written the same way by the Kafka swarm and the in-process mode.

    <run_dir>/manifest.json          the exact manifest the run used
    <run_dir>/steps/<node>.jsonl     one line per policy version > 0: the step's metrics (`step_row`),
                                     with what each source node's groups put into it (`contributions`)
                                     and what the sampler did with each peer's groups (`intake`)
    <run_dir>/rounds/<node>.jsonl    one line per generated round: the on-policy reward (`round_row`)
    <run_dir>/checkpoints/<node>/    the trainer's checkpoints (the last one is the node's final policy),
                                     unless the node's manifest names a `store` (then <store>/<node>/)

`steps` carry the paper's metric: the mean reward of each training batch, external groups included
(docs/architecture.md). `rounds` carry what that metric hides: the mean reward of *every* completion the
node sampled in the round, before any filter, i.e. how good the node's own policy is at that round.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sapo.v1 import policy_pb2, rollout_pb2

STEPS_DIR = "steps"
ROUNDS_DIR = "rounds"


def step_row(
    node_id: str, version: int, batch_id: str, m: policy_pb2.StepMetrics, created_at: float
) -> dict[str, Any]:
    """One trained (or empty) batch: the metrics its `PolicyUpdate` announced."""
    return {
        "node": node_id,
        "version": version,
        "batch_id": batch_id,
        "loss": m.loss,
        "reward_mean": m.reward_mean,
        "local_reward_mean": m.local_reward_mean,
        "local_completions": m.local_completions,
        "external_completions": m.external_completions,
        "clip_fraction_low": m.clip_fraction_low,
        "clip_fraction_high": m.clip_fraction_high,
        "grad_norm": m.grad_norm,
        "entropy": m.entropy,
        "completion_tokens": m.completion_tokens,
        "step_seconds": m.step_seconds,
        "step_cpu_seconds": m.step_cpu_seconds,
        "created_at": created_at,
        "contributions": [
            {
                "node": c.node_id,
                "groups": c.groups,
                "completions": c.completions,
                "completion_tokens": c.completion_tokens,
                "advantage_mass": c.advantage_mass,
            }
            for c in m.contributions
        ],
        "intake": [
            {"node": i.node_id, "received": i.received, "used": i.used, "rejected": dict(i.rejected)}
            for i in m.intake
        ],
    }


def round_row(groups: Sequence[rollout_pb2.RolloutGroup]) -> dict[str, Any]:
    """One node's round: mean reward over every scored completion of its groups (all of one round)."""
    if not groups:
        raise ValueError("a round row needs at least one group")
    first = groups[0]
    scored = [[c.reward for c in g.completions if c.HasField("reward")] for g in groups]
    rewards = [r for group in scored for r in group]
    return {
        "node": first.node_id,
        "round": first.round,
        "policy_version": first.policy_version,
        "groups": len(groups),
        "completions": len(rewards),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "groups_with_signal": sum(len(set(group)) > 1 for group in scored),
        "completed_at": max(g.completed_at.seconds + g.completed_at.nanos / 1e9 for g in groups),
    }


def append_row(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(row) + "\n")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A node's jsonl record; a missing file is an empty record. ValueError naming the file and line
    for a record that is not one JSON object per line."""
    if not path.exists():
        return []
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path} line {number}: not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path} line {number}: not a JSON object")
        rows.append(row)
    return rows


def own_round_rewards(rows: Sequence[dict[str, Any]], rounds: int) -> list[float]:
    """The reward of a node's first `rounds` rounds, in round order. An async node may generate up to
    `max_ahead` rounds more while its peers catch up (the last of them cut short when the run ends):
    those are left out, so nodes compare over the rounds the run was for."""
    ordered = sorted(rows, key=lambda row: row["round"])
    return [row["reward_mean"] for row in ordered[:rounds]]
