"""What a swarm costs at rest: the CPU and wake-ups of bench_pipeline.py's services swarm between rounds.

The swarm (4 nodes of `warm:0`, I/J 4/4, lock-step; the embedded broker and its 12 service processes
pinned to one CPU, as bench_pipeline.py runs them) trains `--rounds` rounds, then sits idle: every node
announced its last version, no work is planned, every consumer waits on its streams. Over a window of
`--window-s` seconds after `--settle-s` more, each process kind's CPU time and each thread kind's
context switches (voluntary and not: every one is a wake-up) are read from /proc; the launcher's own
share is this process draining its recorder every 2 s, as `sapo swarm` does.

Why it matters: bench_pipeline.py's target allows the services 5% more time a round than the same
rounds in one process. A round on the pinned CPU is CPU-bound, so what the swarm burns at rest (the
broker answering empty fetches, librdkafka's threads, each service's idle loop) lengthens every round
by about its share of the CPU, before any record is moved. The idle floor is therefore a lower bound
of that overhead; PASS/FAIL compares it with the 5%.

Two consumer timings run in turn, the second's CPU compared with the first's (the baseline):
`local` (50 ms fetch waits, 500 ms for the watchers: the tests' profile) and `local_swarm` (500 ms
and 1.5 s: what `sapo swarm` gives a swarm on the embedded broker).

    .venv/bin/python bench/bench_idle.py [--rounds 2] [--settle-s 5] [--window-s 30] [--cpus 1]

What it read, per process kind, and where the wake-ups go: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from bench_pipeline import bench_manifest, read_stat

from sapo.cpuslice import DEFAULT_SLICE_MS, request_cpu_slice
from sapo.settings import ConsumerProfile
from sapo.swarm.launcher import Swarm

TARGET = 0.05
"""bench_pipeline.py's target: the services' round at most 5% longer than the in-process one."""
DRAIN_S = 2.0
"""How often `sapo swarm` drains its recorder (run_swarm's refresh)."""


class Reading(NamedTuple):
    """CPU seconds per process kind, and context switches per (process kind, thread name)."""

    cpu: dict[str, float]
    switches: Counter[tuple[str, str]]


def kind_of(name: str) -> str:
    """`node-1-sampler` -> `sampler`; the broker keeps its name."""
    return name.rsplit("-", 1)[-1]


def read(pids: dict[str, int]) -> Reading:
    cpu: dict[str, float] = {}
    switches: Counter[tuple[str, str]] = Counter()
    for name, pid in pids.items():
        kind = kind_of(name)
        try:
            cpu[kind] = cpu.get(kind, 0.0) + read_stat(Path(f"/proc/{pid}/stat"))[2]
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue  # exited: measure() refuses the window
        for task in tasks:
            try:
                thread = (task / "comm").read_text().strip()
                status = (task / "status").read_text().splitlines()
            except OSError:
                continue
            switches[(kind, thread)] += sum(
                int(line.split()[1]) for line in status if "ctxt_switches" in line
            )
    return Reading(cpu, switches)


def measure(profile: str, args: argparse.Namespace, root: Path) -> Reading:
    """Train the rounds, let the swarm settle, and read one idle window."""
    manifest = bench_manifest("warm:0", 4, args.rounds)
    consumer = ConsumerProfile.local() if profile == "local" else ConsumerProfile.local_swarm()
    swarm = Swarm(manifest, root / profile, consumer=consumer)
    try:
        swarm.start()
        assert swarm.recorder is not None and swarm.broker is not None
        recorder, broker = swarm.recorder, swarm.broker
        deadline = time.monotonic() + args.timeout_s
        while not all(recorder.latest.get(n.id, -1) >= n.rounds for n in manifest.nodes):
            if swarm.failed() or time.monotonic() > deadline:
                raise SystemExit(f"{profile}: the swarm did not finish its rounds; see {root / profile}/logs")
            recorder.drain()
            time.sleep(0.5)
        pids = {p.name: p.proc.pid for p in swarm.processes} | {"broker": broker.pid}
        time.sleep(args.settle_s)
        before, own = read(pids), time.process_time()
        end = time.monotonic() + args.window_s
        while time.monotonic() < end:
            recorder.drain()
            time.sleep(min(DRAIN_S, max(0.0, end - time.monotonic())))
        after = read(pids)
        if any(p.proc.poll() is not None for p in swarm.processes):  # failed or not, it left the window
            raise SystemExit(f"{profile}: a service exited during the window; see {root / profile}/logs")
        cpu = {kind: seconds - before.cpu.get(kind, 0.0) for kind, seconds in after.cpu.items()}
        cpu["launcher"] = time.process_time() - own
        return Reading(cpu, after.switches - before.switches)
    finally:
        swarm.stop()


def report(profile: str, reading: Reading, window_s: float) -> float:
    """Print one profile's window; returns its CPU share."""
    share = sum(reading.cpu.values()) / window_s
    kinds = "  ".join(f"{k} {100 * v / window_s:.2f}%" for k, v in sorted(reading.cpu.items()))
    print(f"{profile}: {100 * share:.2f}% of a CPU at rest ({kinds})")
    total = sum(reading.switches.values()) / window_s
    print(f"  wake-ups {total:,.0f}/s; by process kind and thread name:")
    for (kind, thread), count in reading.switches.most_common(12):
        print(f"    {kind:<10} {thread:<18} {count / window_s:8.1f}/s")
    return share


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds trained before the idle window")
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait after the last version")
    parser.add_argument("--window-s", type=float, default=30.0, help="length of the idle window")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up on the rounds after this")
    parser.add_argument("--cpus", type=int, default=1, help="pin to this many CPUs (0: none)")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])  # the children inherit it
    request_cpu_slice(DEFAULT_SLICE_MS)  # as `sapo swarm` does before it starts anything
    shares = {}
    root = Path(tempfile.mkdtemp(prefix="bench-idle-"))  # kept when a run fails: its logs say why
    for profile in ("local", "local_swarm"):
        shares[profile] = report(profile, measure(profile, args, root), args.window_s)
    shutil.rmtree(root)
    base, swarm = shares["local"], shares["local_swarm"]
    print(f"\nlocal_swarm / local (CPU at rest): {swarm / base:.3f}")
    verdict = "PASS" if swarm <= TARGET else "FAIL"
    print(
        f"{verdict}: the launcher's swarm burns {100 * swarm:.2f}% of a CPU at rest, {swarm / TARGET:.2f} x "
        f"the whole {TARGET:.0%} bench_pipeline.py allows the services a round"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
