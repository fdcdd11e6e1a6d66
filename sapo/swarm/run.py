"""`sapo swarm`: start a local swarm, show its progress, stop it cleanly, summarise the run."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from sapo.lifecycle import StopFlag, install_signal_handlers
from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, read_rows
from sapo.swarm.launcher import Swarm
from sapo.swarm.manifest import SwarmManifest
from sapo.swarm.progress import NodeStatus, render, scrape


def _statuses(swarm: Swarm, last: dict[tuple[str, str], Any]) -> list[NodeStatus]:
    """Current metrics per node; a service that already finished (a generator past its last round)
    keeps showing its final numbers."""
    by_node: dict[str, dict[str, Any]] = {}
    for p in swarm.processes:
        url = p.metrics_url
        samples = scrape(url) if url else {}
        if samples:
            last[(p.node, p.service)] = samples
        by_node.setdefault(p.node, {})[p.service] = last.get((p.node, p.service), {})
    return [
        NodeStatus.read(node, m.get("generator", {}), m.get("sampler", {}), m.get("trainer", {}))
        for node, m in by_node.items()
    ]


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def summarize(manifest: SwarmManifest, run_dir: Path) -> dict[str, Any]:
    """Per node: steps trained, the batch reward (the paper's metric: external groups included) first,
    last and summed, and the on-policy reward of the node's own rounds (every completion it sampled)."""
    nodes: dict[str, Any] = {}
    for node in manifest.nodes:
        steps = read_rows(run_dir / STEPS_DIR / f"{node.id}.jsonl")
        rewards = [s["reward_mean"] for s in steps if s["completion_tokens"]]
        rounds = [r["reward_mean"] for r in read_rows(run_dir / ROUNDS_DIR / f"{node.id}.jsonl")]
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


def run_swarm(
    manifest: SwarmManifest, run_dir: Path, refresh_s: float = 2.0, out: TextIO = sys.stdout
) -> int:
    """Run until every node has trained its rounds, a service fails, or Ctrl-C; returns an exit code."""
    stop = StopFlag()
    install_signal_handlers(stop)
    swarm = Swarm(manifest, run_dir)
    rounds = max(n.rounds for n in manifest.nodes)
    code = 0
    started = time.monotonic()
    live = out.isatty()
    try:
        swarm.start()
        out.write(f"broker {swarm.bootstrap}; logs in {run_dir / 'logs'}\n")
        last_print = 0.0
        last_samples: dict[tuple[str, str], Any] = {}
        while not stop.is_set():
            if swarm.recorder is not None:
                swarm.recorder.drain()
            statuses = _statuses(swarm, last_samples)
            now = time.monotonic()
            if live or now - last_print >= 15:
                view = render(statuses, rounds, now - started)
                out.write(("\x1b[2J\x1b[H" + view + "\n") if live else view + "\n")
                out.flush()
                last_print = now
            failed = swarm.failed()
            if failed:
                for p in failed:
                    out.write(f"\n{p.node}/{p.service} exited with {p.proc.returncode}; log tail:\n")
                    out.write(_log_tail(p.log_path) + "\n")
                code = 1
                break
            targets = {n.id: n.rounds for n in manifest.nodes}
            if statuses and all(s.policy_version >= targets[s.node] for s in statuses):
                break
            stop.wait(refresh_s)
        if stop.is_set():
            out.write(f"\nstopping ({stop.reason})\n")
            code = 130
    finally:
        swarm.stop()
    print_summary(summarize(manifest, run_dir), out)
    return code


def run_local(manifest: SwarmManifest, run_dir: Path, *, in_process: bool, out: TextIO = sys.stdout) -> int:
    """The swarm through Kafka and separate service processes, or in this process without Kafka."""
    if in_process:
        from sapo.swarm.inprocess import run_inprocess  # it builds on this module

        code: int = run_inprocess(manifest, run_dir, out)
        return code
    return run_swarm(manifest, run_dir, out=out)
