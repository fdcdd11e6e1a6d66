"""The end-of-run summary of a swarm, written by both modes from the run record."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO

from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, own_round_rewards, read_rows
from sapo.swarm.manifest import SwarmManifest


def summarize(manifest: SwarmManifest, run_dir: Path) -> dict[str, Any]:
    """Per node: steps trained, the batch reward (the paper's metric: external groups included) first,
    last and summed, and the on-policy reward of the node's own rounds (every completion it sampled)."""
    nodes: dict[str, Any] = {}
    for node in manifest.nodes:
        steps = read_rows(run_dir / STEPS_DIR / f"{node.id}.jsonl")
        rewards = [s["reward_mean"] for s in steps if s["completion_tokens"]]
        rounds = own_round_rewards(read_rows(run_dir / ROUNDS_DIR / f"{node.id}.jsonl"), node.rounds)
        nodes[node.id] = {
            "steps": len(steps),
            "reward_sum": sum(rewards),
            "reward_first": rewards[0] if rewards else math.nan,
            "reward_last": rewards[-1] if rewards else math.nan,
            "rounds": len(rounds),
            "round_reward_first": rounds[0] if rounds else math.nan,
            "round_reward_last": rounds[-1] if rounds else math.nan,
        }
    summary = {"run_dir": str(run_dir), "nodes": nodes}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def print_summary(summary: dict[str, Any], out: TextIO) -> None:
    out.write(f"\nrun directory: {summary['run_dir']}\n")
    out.write("batch reward: the paper's metric (external groups included); own rounds: on-policy reward\n")
    out.write(
        f"{'node':<12} {'steps':>5} {'batch first':>11} {'last':>6} {'sum':>8}"
        f" {'own round first':>15} {'last':>6}\n"
    )
    for node, s in summary["nodes"].items():
        out.write(
            f"{node:<12} {s['steps']:>5} {s['reward_first']:>11.3f} {s['reward_last']:>6.3f}"
            f" {s['reward_sum']:>8.3f} {s['round_reward_first']:>15.3f} {s['round_reward_last']:>6.3f}\n"
        )
