"""`sapo swarm`: start a local swarm, show its progress, stop it cleanly, summarise the run."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from sapo.cpuslice import DEFAULT_SLICE_MS, request_cpu_slice
from sapo.lifecycle import StopFlag, install_signal_handlers
from sapo.settings import ConsumerProfile
from sapo.swarm.launcher import Swarm
from sapo.swarm.manifest import SwarmManifest
from sapo.swarm.progress import NodeStatus, Samples, render, scrape
from sapo.swarm.summary import print_summary, summarize


def _statuses(swarm: Swarm, last: dict[str, Samples]) -> list[NodeStatus]:
    """Current metrics per node (generator replicas added up); a service that already finished keeps
    showing its final numbers."""
    by_node: dict[str, dict[str, Samples]] = {}
    for p in swarm.processes:
        url = p.metrics_url
        samples = scrape(url, NodeStatus.METRICS) if url else {}
        if samples:
            last[p.name] = samples
        merged = by_node.setdefault(p.node, {}).setdefault(p.service, {})
        for metric, values in last.get(p.name, {}).items():
            merged.setdefault(metric, []).extend(values)
    return [
        NodeStatus.read(node, m.get("generator", {}), m.get("sampler", {}), m.get("trainer", {}))
        for node, m in by_node.items()
    ]


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_swarm(
    manifest: SwarmManifest,
    run_dir: Path,
    refresh_s: float = 2.0,
    out: TextIO = sys.stdout,
    consumer: ConsumerProfile | None = None,
) -> int:
    """Run until every node has trained its rounds, a service fails, or Ctrl-C; returns an exit code.
    `consumer`: the consumer timing of every process (None: `Swarm`'s choice)."""
    stop = StopFlag()
    install_signal_handlers(stop)
    # Before the broker and the services start: they inherit it (`sapo.cpuslice`; the services ask again).
    request_cpu_slice(DEFAULT_SLICE_MS)
    swarm = Swarm(manifest, run_dir, consumer=consumer)
    rounds = max(n.rounds for n in manifest.nodes)
    code = 0
    started = time.monotonic()
    live = out.isatty()
    try:
        swarm.start()
        out.write(f"broker {swarm.bootstrap}; logs in {run_dir / 'logs'}\n")
        last_print = 0.0
        last_samples: dict[str, Samples] = {}
        targets = {n.id: n.rounds for n in manifest.nodes}
        recorder = swarm.recorder
        assert recorder is not None  # set by start()
        while not stop.is_set():
            recorder.drain()
            now = time.monotonic()
            # The view is the only reader of the services' /metrics: scraped when it is shown (every
            # refresh on a terminal, every 15 s into a log), never just to learn that the run is done.
            if live or now - last_print >= 15:
                view = render(_statuses(swarm, last_samples), rounds, now - started)
                out.write(("\x1b[2J\x1b[H" + view + "\n") if live else view + "\n")
                out.flush()
                last_print = now
            failed = swarm.failed()
            if failed:
                for p in failed:
                    out.write(f"\n{p.name} exited with {p.proc.returncode}; log tail:\n")
                    out.write(_log_tail(p.log_path) + "\n")
                code = 1
                break
            if all(recorder.latest.get(node, -1) >= target for node, target in targets.items()):
                break  # every node announced its last version on its policy topic
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
        # Imported here: the in-process mode loads torch and models, which the launcher of the
        # services never needs.
        from sapo.swarm.inprocess import run_inprocess

        code: int = run_inprocess(manifest, run_dir, out)
        return code
    return run_swarm(manifest, run_dir, out=out)
