"""`sapo swarm`: start a local swarm, show its progress, stop it cleanly, summarise the run."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from sapo.lifecycle import StopFlag, install_signal_handlers
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


def read_steps(path: Path) -> list[dict[str, Any]]:
    """A trainer's per-step log (one JSON object a line); missing file = no steps."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(swarm: Swarm) -> dict[str, Any]:
    nodes: dict[str, Any] = {}
    for node in swarm.manifest.nodes:
        steps = read_steps(swarm.run_dir / "steps" / f"{node.id}.jsonl")
        rewards = [s["reward_mean"] for s in steps if s["completion_tokens"]]
        local = [s["local_reward_mean"] for s in steps if s["completion_tokens"]]
        nodes[node.id] = {
            "steps": len(steps),
            "reward_sum": sum(rewards),
            "reward_first": rewards[0] if rewards else math.nan,
            "reward_last": rewards[-1] if rewards else math.nan,
            "local_reward_mean": sum(local) / len(local) if local else math.nan,
        }
    summary = {"run_dir": str(swarm.run_dir), "nodes": nodes}
    (swarm.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    out.write(f"\nrun directory: {summary['run_dir']}\n")
    out.write(f"{'node':<12} {'steps':>5} {'reward first':>12} {'reward last':>11} {'sum':>8}\n")
    for node, s in summary["nodes"].items():
        first, last, total = s["reward_first"], s["reward_last"], s["reward_sum"]
        out.write(f"{node:<12} {s['steps']:>5} {first:>12.3f} {last:>11.3f} {total:>8.3f}\n")


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
    _print_summary(summarize(swarm), out)
    return code
