"""Pipeline overhead: seconds per round of one manifest through Kafka and separate services vs in process.

Both modes run the same work: the same nodes, models, seeds and rounds (lock-step, so each round is
one generation of B x L completions and one GRPO step per node). Kafka: `sapo.swarm.run.run_swarm`,
three service processes per node on the embedded broker, checkpoints every step because the
generators load their weights from them. In process: `sapo.swarm.inprocess.run_inprocess`, the same
core functions called directly on one shared model per node.

How start-up is excluded: both modes write one step row per trained version with a wall-clock
`created_at` (Kafka: the checkpoint the trainer announced; in process: right after the step). Per
node, seconds per round = (created_at of the last version - that of version 1) / (rounds - 1), i.e.
the time from the end of the first round to the end of the last one; the table shows the mean over
nodes. Broker start, consumer-group joins, model loads and round 0 are therefore outside the window.
With --repeats > 1 the modes alternate (Kafka first on odd repeats) and medians are compared.

Like for like: the in-process mode runs the nodes one after another on one thread, while the services
of all nodes run concurrently on every core. So by default the whole benchmark (this process, the
broker and every service process, which inherit it) is pinned to ONE CPU (`--cpus 1`,
sched_setaffinity): both modes then have the same hardware, and the difference is the pipeline's
cost (serialization, the broker, polling, checkpoints written and re-read every round, process
switches). `--cpus 0` leaves the affinity alone; the services then also gain from parallelism, which
is a different question. The CPU seconds of each whole run (start-up included; Kafka: every child
process plus this one) are printed too, the broker's apart.

The script restarts itself with the allocator setting the services start with
(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, `sapo/malloc.py`), so that the in-process run allocates
alike. It also prints the median CPU of one training step per mode (the step rows'
`step_cpu_seconds`: the trainer process's, all threads): the same step (the same tokens per step,
within 2%) in both modes, so a ratio above 1 means the services' layout (13 processes and their model
copies on one CPU) slowed the shared work down, a cost that is in no component of a profile.

Run it on an otherwise idle machine. Other jobs skew it toward the services: while the services'
13 processes are pinned to the CPU, the kernel moves the other jobs to the remaining cores; while the
in-process run's single process is, it does not, and that run shares its CPU. Even idle, the host's
speed drifts by more than the target between runs and within one: compare medians of repeats and
the CPU seconds (the broker's is the steadier figure), not one run's ratio.

`--side-by-side` runs each repeat's two modes at the same time, each pinned to its own CPU (swapped
every repeat; the in-process run starts, in a child process, once the services trained their first
version, so that the windows overlap): both then see the same spells of the host's speed, and share
its last-level cache and memory. `--one-wait` adds a third mode, in turn, with every consumer
(watchers too) at the tests' 50 ms fetch wait: what the launcher's longer waits
(`ConsumerProfile.local_swarm`) save.

Part of the services' cost is fixed per round (the broker's fetches, the services' loops and idle
threads), so the cheaper the model work both modes share, the larger that part is as a share of a
round. `bench/bench_idle.py` measures the same swarm at rest: a floor under this overhead.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_pipeline.py [--model warm:0] [--nodes 4] [--rounds 10]
        [--repeats 2] [--one-wait | --side-by-side]

Target: overhead = Kafka / in-process - 1 <= 5%, on the medians; the PASS/FAIL line compares it with
the target. A quick check of the script itself:

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_pipeline.py --model tiny:0 --nodes 2 --rounds 2

What it read as the code changed, run by run: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from sapo.experiment.plan import load_scenario, manifest_data, select
from sapo.malloc import restart_with_malloc_tunable
from sapo.settings import ConsumerProfile
from sapo.swarm.history import STEPS_DIR, read_rows
from sapo.swarm.inprocess import run_inprocess
from sapo.swarm.manifest import SwarmManifest, parse_manifest
from sapo.swarm.run import run_swarm

TARGET_OVERHEAD = 0.05
TICK = os.sysconf("SC_CLK_TCK")
RESULT = "result.json"
"""What a --side-by-side child leaves in its run directory: [seconds per round, CPU seconds]."""


def bench_manifest(model: str, nodes: int, rounds: int) -> SwarmManifest:
    """The CPU experiment's swarm (`sapo experiment --scenario cpu`) at I/J 4/4, seed 0."""
    scenario = select(load_scenario("cpu"), nodes=nodes, overrides={"rounds": rounds, "model": model})
    return parse_manifest(manifest_data(scenario, "4/4", seed=0) | {"name": "bench-pipeline"})


class Run(NamedTuple):
    """One mode's run: seconds per round in the window, CPU seconds of the whole run, and the median
    CPU seconds of one training step in the window (the same work in both modes)."""

    per_round: float
    cpu: float
    step_cpu: float


def step_cpu_seconds(run_dir: Path, manifest: SwarmManifest) -> float:
    """Median over the window's steps (every version after 1) of the trainer's CPU per step."""
    rows = [r for node in manifest.nodes for r in read_rows(run_dir / STEPS_DIR / f"{node.id}.jsonl")]
    return statistics.median(float(r["step_cpu_seconds"]) for r in rows if r["version"] > 1)


def seconds_per_round(run_dir: Path, manifest: SwarmManifest) -> float:
    """Mean over nodes of (t[last version] - t[version 1]) / (versions - 1), from the step rows."""
    per_node = []
    for node in manifest.nodes:
        rows = sorted(read_rows(run_dir / STEPS_DIR / f"{node.id}.jsonl"), key=lambda r: r["version"])
        if len(rows) != node.rounds or rows[0]["version"] != 1:
            raise RuntimeError(f"{node.id}: {len(rows)} step rows in {run_dir}, expected {node.rounds}")
        per_node.append((rows[-1]["created_at"] - rows[0]["created_at"]) / (len(rows) - 1))
    return statistics.fmean(per_node)


def cpu_seconds() -> float:
    """CPU time of this process and of every child it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def read_stat(path: Path) -> tuple[str, int, float]:
    """(command name, parent pid, CPU seconds) of a process from its /proc/PID/stat; raises OSError
    when it has exited."""
    name, _, rest = path.read_text().rpartition(")")
    fields = rest.split()
    return name.partition("(")[2], int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


class BrokerCpu:
    """CPU seconds of the embedded brokers this process starts (a child named `tansu`), sampled from
    /proc every half second while a run lasts: the rusage of children mixes them with the services."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> BrokerCpu:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())

    def _sample(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.5):
            # Every process until the broker shows up, then only it (a scan costs ~200 file reads).
            known = [Path(f"/proc/{pid}/stat") for pid in self.seen]
            for stat in known or Path("/proc").glob("[0-9]*/stat"):
                try:
                    name, parent, cpu = read_stat(stat)
                except OSError:
                    continue  # exited meanwhile
                if name == "tansu" and parent == me:
                    self.seen[int(stat.parent.name)] = cpu


def measure(
    mode: str, run: Callable[[SwarmManifest, Path, io.StringIO], int], manifest: SwarmManifest, run_dir: Path
) -> Run:
    """One mode's run; its output goes to run.log."""
    run_dir.mkdir(parents=True)
    log = io.StringIO()
    cpu, wall = cpu_seconds(), time.monotonic()
    with BrokerCpu() as broker:
        code = run(manifest, run_dir, log)
    cpu, wall = cpu_seconds() - cpu, time.monotonic() - wall
    (run_dir / "run.log").write_text(log.getvalue())
    if code != 0:
        raise SystemExit(f"{mode} run failed with exit status {code}; see {run_dir / 'run.log'}")
    result = Run(seconds_per_round(run_dir, manifest), cpu, step_cpu_seconds(run_dir, manifest))
    print(
        f"  {mode:<10} {result.per_round:8.3f} s/round   {cpu:7.1f} cpu s (broker {broker.seconds:5.1f})   "
        f"{wall:6.1f} s wall in all   {result.step_cpu:.3f} cpu s per training step",
        flush=True,
    )
    return result


def kafka(manifest: SwarmManifest, run_dir: Path, out: io.StringIO) -> int:
    return run_swarm(manifest, run_dir, out=out)  # its progress view polls as `sapo swarm` does


def kafka_one_wait(manifest: SwarmManifest, run_dir: Path, out: io.StringIO) -> int:
    """The services with every consumer at the tests' 50 ms fetch wait, watchers too (the launcher's
    profile before `ConsumerProfile.local_swarm` and the watchers' own wait): what those two save."""
    local = ConsumerProfile.local()
    one_wait = local.model_copy(update={"watch_fetch_wait_max_ms": local.fetch_wait_max_ms})
    return run_swarm(manifest, run_dir, out=out, consumer=one_wait)


def inprocess(manifest: SwarmManifest, run_dir: Path, out: io.StringIO) -> int:
    return run_inprocess(manifest, run_dir, out)


def side_by_side(
    args: argparse.Namespace, manifest: SwarmManifest, root: Path, repeat: int, cores: list[int]
) -> tuple[Run, Run]:
    """One repeat of both modes at once: the services on `cores[0]`; once they trained their first
    version (their start-up is ~5 x the in-process run's), the in-process run in a child process of
    this script on `cores[1]`, so that the two windows overlap. The child's CPU seconds are its own
    (reaped only after the services' run was measured, it is never in their children's rusage)."""
    os.sched_setaffinity(0, {cores[0]})  # the broker and the services inherit it
    kafka_dir, run_dir = root / f"kafka-{repeat}", root / f"inprocess-{repeat}"
    command = [sys.executable, __file__, "--model", args.model, "--nodes", str(args.nodes)]
    command += ["--rounds", str(args.rounds), "--inprocess-into", str(run_dir)]
    children: list[subprocess.Popen[bytes]] = []
    done = threading.Event()

    def start_when_trained() -> None:
        while not done.wait(0.5):
            if any((kafka_dir / STEPS_DIR).glob("*.jsonl")):
                os.sched_setaffinity(0, {cores[1]})  # this thread only; the child inherits it
                children.append(subprocess.Popen(command))
                return

    starter = threading.Thread(target=start_when_trained, daemon=True)
    starter.start()
    measured = False
    try:
        services = measure("kafka", kafka, manifest, kafka_dir)
        measured = True
    finally:
        done.set()
        starter.join()  # before any kill: no child starts after it
        for child in [] if measured else children:  # no orphan left computing on the other CPU
            child.kill()
            child.wait()
    if not children:
        raise SystemExit(f"the services trained no version; see {kafka_dir / 'run.log'}")
    if (code := children[0].wait()) != 0:
        raise SystemExit(f"the in-process run failed with exit status {code}; see {run_dir / 'run.log'}")
    return services, Run(*json.loads((run_dir / RESULT).read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="warm:0", help="model ref of every node (default warm:0)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes, seeds 1..N (default 4)")
    parser.add_argument("--rounds", type=int, default=10, help="lock-step rounds, >= 2 (default 10)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode, alternating (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the run directories under this directory")
    parser.add_argument(
        "--cpus", type=int, default=1, help="pin everything to this many CPUs (default 1; 0 = no pinning)"
    )
    parser.add_argument(
        "--one-wait",
        action="store_true",
        help="also run the services with every consumer at the short fetch wait (watchers too)",
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="run each repeat's two modes at the same time, each pinned to its own CPU (swapped every "
        "repeat), so that both see the same spells of a shared host's speed",
    )
    parser.add_argument("--inprocess-into", type=Path, help=argparse.SUPPRESS)  # --side-by-side's child
    args = parser.parse_args()
    restart_with_malloc_tunable()  # the in-process run allocates as the launcher's services do
    if args.rounds < 2 or args.nodes < 1 or args.repeats < 1:
        parser.error(
            "--rounds must be >= 2 (the window spans version 1 to the last), --nodes and --repeats >= 1"
        )
    manifest = bench_manifest(args.model, args.nodes, args.rounds)
    if args.inprocess_into:
        result = measure("inprocess", inprocess, manifest, args.inprocess_into)
        (args.inprocess_into / RESULT).write_text(json.dumps(result))
        return 0
    available = sorted(os.sched_getaffinity(0))
    if args.side_by_side and (args.cpus != 1 or args.one_wait or len(available) < 2):
        parser.error("--side-by-side needs --cpus 1 (the default), two usable CPUs and no --one-wait")
    if args.cpus:
        os.sched_setaffinity(0, available[: args.cpus])  # children (broker, services) inherit it
    pinned = f"pinned to {args.cpus} CPU(s)" if args.cpus else f"on all {len(available)} CPUs"
    if args.side_by_side:
        pinned += " each, side by side"
    modes = {"kafka": kafka, "inprocess": inprocess}
    if args.one_wait:
        modes["one-wait"] = kafka_one_wait
    results: dict[str, list[Run]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        root = args.keep or Path(tmp)
        print(
            f"{args.nodes} nodes of {args.model}, 8x8 per round, I/J 4/4, 24 new tokens, "
            f"{args.rounds} rounds, {pinned}"
        )
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}:")
            if args.side_by_side:
                cores = available[:2] if repeat % 2 == 0 else available[1::-1]
                kafka_run, inprocess_run = side_by_side(args, manifest, root, repeat, cores)
                results["kafka"].append(kafka_run)
                results["inprocess"].append(inprocess_run)
                continue
            order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                run_dir = root / f"{mode}-{repeat}"
                results[mode].append(measure(mode, modes[mode], manifest, run_dir))
    kafka_s = statistics.median(r.per_round for r in results["kafka"])
    inprocess_s = statistics.median(r.per_round for r in results["inprocess"])
    overhead = kafka_s / inprocess_s - 1
    verdict = "PASS" if overhead <= TARGET_OVERHEAD else "FAIL"
    pairs = list(zip(results["kafka"], results["inprocess"], strict=True))
    paired = [k.per_round / i.per_round for k, i in pairs]
    steps = [k.step_cpu / i.step_cpu for k, i in pairs]
    print(f"\nkafka / in process per repeat: {', '.join(f'{r:.3f}' for r in paired)}")
    # The same step's CPU in both modes: above 1, the services' layout (13 processes and their model
    # copies on one CPU) slowed the shared work down, a cost that is in no component of a profile.
    print(f"CPU of one training step, kafka / in process per repeat: {', '.join(f'{r:.3f}' for r in steps)}")
    print(f"kafka {kafka_s:.3f} s/round, in process {inprocess_s:.3f} s/round (medians)")
    print(f"ratio kafka / in process = {kafka_s / inprocess_s:.3f}: overhead {overhead:+.1%}")
    print(f"{verdict}: overhead {overhead:+.1%} against the target <= {TARGET_OVERHEAD:.0%} ({pinned})")
    if args.one_wait:
        one_wait_s = statistics.median(r.per_round for r in results["one-wait"])
        print(
            f"every consumer at the short wait: {one_wait_s:.3f} s/round, "
            f"{one_wait_s / kafka_s:.3f} x kafka's (overhead {one_wait_s / inprocess_s - 1:+.1%})"
        )
    if not args.cpus:
        print("not like for like: the services ran concurrently on every CPU, the in-process nodes on one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
