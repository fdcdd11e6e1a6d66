"""Where the services' rounds go: py-spy samples every process of bench_pipeline.py's Kafka swarm.

The pipeline bench says how much slower the services are than the same work in process; this says
where that time goes. It runs the bench's manifest (4 nodes of warm:0, 8x8 per round, I/J 4/4, pinned
to one CPU by default, like the bench) through the Kafka services under `py-spy record --subprocesses`,
which samples the launcher and every generator, sampler and trainer process (the broker is a Rust
binary that py-spy does not sample; its CPU time is printed from /proc instead), then attributes each
sample to a component:

  start-up        anything under an import, and model loading before the first round
  model           forward passes, backward, optimizer (the work the in-process run does too)
  the rest        Kafka client, protobuf, checkpoint writes and reads, digests, signatures, tasks and
                  rewards, the services' own logic: the pipeline's cost

A sample goes to start-up when any of its frames is an import; otherwise to the innermost frame that
belongs to a known component (so torch code called from a checkpoint write counts as checkpoint I/O,
and the hashing under sapo.digests as digests). py-spy is meant to count a sample only for a thread that is
running or runnable (`--idle` is off), but it still reports threads blocked in some waits now and then
(an ops server's select, a stop flag's wait: `IDLE_LEAVES`); those samples are counted apart and left
out. Each process kind's CPU seconds from /proc are split in the proportions of its samples.

The first table needs no sampling: each process kind's CPU from /proc between the first version 1 and
the last node's last version (bench_pipeline's window), per round, with how busy the pinned CPU was
(below 100%, the round also waited on something other than CPU).

    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_round.py --out results/profile

Needs py-spy (in the dev extra). It writes report.md (the tables), collapsed.txt (the top stacks) and
processes.json (each process's command line and CPU seconds) under --out. Numbers depend on the
machine's load; the shares are what to read.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench_pipeline import bench_manifest, kafka, read_stat, seconds_per_round

from sapo.swarm.history import STEPS_DIR, read_rows
from sapo.swarm.manifest import SwarmManifest

ROLES = ("generator", "sampler", "trainer", "launcher")
# What the in-process run does as well; the other components are (mostly) the pipeline's own cost.
SHARED_WORK = ("model forward", "training step", "generation loop", "tasks and rewards", "tokenizer")

# (component, substrings of a frame's "function (file:line)"), innermost matching frame wins.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("digests", ("sapo/digests.py", "hashlib")),
    (
        "checkpoint I/O",
        (
            "sapo/tensorfile.py",
            "sapo/checkpoints.py",
            "sapo/storage.py",
            "safetensors",
            "torch/serialization.py",
            "fsspec",
        ),
    ),
    ("weights reload", ("sapo/generator/reload.py", "sapo/models/", "load_state_dict")),
    ("signatures", ("sapo/identity/", "cryptography")),
    ("protobuf", ("google/protobuf", "_pb2.py", "sapo/wire.py")),
    ("Kafka client", ("confluent_kafka", "sapo/kafka/")),
    ("tasks and rewards", ("reasoning_gym", "sapo/tasks/")),
    ("training step", ("torch/autograd", "torch/optim", "sapo/grpo/", "sapo/trainer/")),
    (
        "model forward",
        (
            "torch/nn/",
            "transformers/models/",
            "transformers/modeling",
            "transformers/masking",
            "transformers/integrations/sdpa",
            "transformers/cache_utils",
        ),
    ),
    ("generation loop", ("transformers/generation/", "sapo/backends/")),
    ("tokenizer", ("tokenizers", "transformers/tokenization")),
    ("service logic", ("sapo/sampler/", "sapo/node/", "sapo/generator/", "services/", "sapo/lifecycle.py")),
    ("swarm monitor", ("sapo/swarm/",)),
)
IMPORT_MARKERS = ("<frozen importlib", "importlib/__init__.py")
# Building a service (model and tokenizer loads, gc.freeze of the start-up objects); the launcher
# starting the broker and the services.
START_UP_MARKERS = (
    "Swarm.start (",
    "from_pretrained",
    "load_model (",
    "sapo/node/build.py",
    "from_runtime (",
    "freeze_startup_objects (",
    "TokenizersBackend.__init__",
)

# Innermost frames of a thread blocked in a wait (an ops server's select, a sampler's idle pause, a
# stop flag's wait): py-spy's --nonblocking sampling still reports such threads now and then, and a
# sample of one would take a share of its process's CPU from the work that used it. The compute gate
# (`sapo.cpugate`) is one too: on the pinned CPU its single slot is waited on in the kernel, and the
# release wakes the next holder, which runs while the releasing thread, still on that line, waits its
# turn for the CPU (py-spy counts a runnable thread as active).
IDLE_LEAVES = ("_PollLikeSelector.select (", "Condition.wait (", "socket.accept (", "ComputeGate.hold (")

PROCESS = re.compile(r'^process (\d+):"(.*?)"$', re.S)


@dataclass
class Tally:
    """Samples per (role, component) plus per-role leaf functions, from py-spy's collapsed output."""

    samples: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    leaves: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    stacks: collections.Counter[str] = field(default_factory=collections.Counter)
    idle: collections.Counter[str] = field(default_factory=collections.Counter)
    """Samples per role of threads blocked in a wait (`IDLE_LEAVES`), left out of `samples`."""


def role_of(command: str) -> str:
    for role in ROLES[:3]:
        if f"services.{role}.main" in command or f"sapo-{role}" in command:
            return role
    return "broker" if "tansu" in command else "launcher"


class CpuWatch(threading.Thread):
    """CPU seconds per role of every process below this one, from /proc twice a second (a process's
    last reading before it exits; py-spy's samples count runnable time too, so they are scaled to
    these per role)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()
        self.last: dict[int, tuple[str, float]] = {}
        self.own_cpu = 0.0  # this thread's: the launcher's figure leaves it out
        self.series: list[tuple[float, dict[str, float]]] = []
        """(wall time, CPU seconds per role so far) after every reading."""
        self.own_command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            self.read()
            self.series.append((time.time(), self._totals(time.thread_time())))
        self.own_cpu = time.thread_time()

    def read(self) -> None:
        stats: dict[int, tuple[int, float]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    _, parent, cpu = read_stat(Path(entry.path, "stat"))
                except OSError:
                    continue
                stats[int(entry.name)] = (parent, cpu)
        me = os.getpid()
        for pid, (_, cpu) in stats.items():
            ancestor = pid
            while ancestor in stats and ancestor not in (me, 1, 0):
                ancestor = stats[ancestor][0]
            if ancestor == me and pid != me:
                known = self.last.get(pid, ("", 0.0))[0]
                self.last[pid] = (known or self._command(pid), cpu)

    def _totals(self, own_cpu: float) -> dict[str, float]:
        """CPU seconds per role so far; `own_cpu`: this thread's, left out of the launcher's."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        out: dict[str, float] = {"launcher": own.ru_utime + own.ru_stime - own_cpu}
        for command, cpu in self.last.values():
            out[role_of(command)] = out.get(role_of(command), 0.0) + cpu
        return out

    def between(self, start: float, end: float) -> tuple[float, dict[str, float]]:
        """(seconds, CPU seconds per role) between the readings nearest two wall times."""
        first = min(self.series, key=lambda item: abs(item[0] - start))
        last = min(self.series, key=lambda item: abs(item[0] - end))
        roles = set(first[1]) | set(last[1])
        return last[0] - first[0], {r: last[1].get(r, 0.0) - first[1].get(r, 0.0) for r in roles}

    def _command(self, pid: int) -> str:
        """The process's command line once it has one of its own: empty for a zombie, and the parent's
        between fork and exec (read again next time)."""
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""
        return "" if command == self.own_command else command

    def per_role(self) -> dict[str, float]:
        self.halt.set()
        self.join()
        self.read()
        return self._totals(self.own_cpu)

    def processes(self) -> dict[str, tuple[str, float]]:
        return {str(pid): entry for pid, entry in self.last.items()}


def component_of(frames: Sequence[str]) -> str:
    """The component a sample belongs to: start-up if any frame imports or loads the model, else the
    innermost frame's known component, else other."""
    if any(m in f for f in frames for m in IMPORT_MARKERS + START_UP_MARKERS):
        return "start-up"
    for frame in reversed(frames):
        for name, markers in COMPONENTS:
            if any(m in frame for m in markers):
                return name
    return "other"


def tally(lines: Iterable[str]) -> Tally:
    """Parse `py-spy record --format raw` lines: `process PID:"cmd";...;frame;...;frame COUNT`, where a
    child's stack starts with its ancestors' `process` entries. A main thread's role comes from its
    frames (a service runs `services/<role>/main.py`), since py-spy can name a child it found between
    fork and exec with its parent's command line; other threads' from that name."""
    out = Tally()
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [f for f in stack.split(";") if f and not PROCESS.match(f) and not f.startswith("thread ")]
        if not frames or any("CpuWatch" in f for f in frames):  # the profiler's own thread
            continue
        labels = [m.group(2) for m in map(PROCESS.match, stack.split(";")) if m]
        by_frames = (r for r in ROLES[:3] for f in frames[:4] if f"services/{r}/main.py" in f)
        role = next(by_frames, role_of(labels[-1]) if labels else "launcher")  # threads: by label
        count = int(count_text)
        if any(frames[-1].startswith(leaf) for leaf in IDLE_LEAVES):
            out.idle[role] += count
            continue
        component = component_of(frames)
        out.samples[(role, component)] += count
        if component != "start-up":
            out.leaves[role][_short(frames[-1])] += count
        out.stacks[f"{role};{';'.join(_short(f) for f in frames)}"] += count
    return out


def _short(frame: str) -> str:
    """`fn (/long/path/site-packages/pkg/mod.py:12)` -> `fn (pkg/mod.py:12)`."""
    return re.sub(r"\((?:[^()]*?/(?:site-packages|main|lib/python3\.\d+)/)", "(", frame)


def attributed(counts: Tally, cpu: dict[str, float]) -> dict[tuple[str, str], float]:
    """CPU seconds per (role, component): each role's measured CPU split in its samples' proportions
    (py-spy also samples runnable threads waiting for a CPU, so raw samples overstate busy roles)."""
    per_role: collections.Counter[str] = collections.Counter()
    for (role, _), n in counts.samples.items():
        per_role[role] += n
    out = {key: cpu.get(key[0], 0.0) * n / per_role[key[0]] for key, n in counts.samples.items()}
    for role in set(cpu) - set(per_role):  # the broker, and any role py-spy did not catch
        out[(role, "not sampled (native)")] = cpu[role]
    return out


def table(seconds: dict[tuple[str, str], float], rounds: int) -> str:
    roles = [r for r in (*ROLES, "broker") if any(role == r for role, _ in seconds)]
    totals: dict[str, float] = {}
    for (_, component), value in seconds.items():
        totals[component] = totals.get(component, 0.0) + value
    lines = [
        "| component | " + " | ".join(roles) + " | all | per round |",
        "|---|" + "---|" * (len(roles) + 2),
    ]
    for component, total in sorted(totals.items(), key=lambda item: -item[1]):
        cells = " | ".join(f"{seconds.get((r, component), 0.0):.1f}" for r in roles)
        per_round = "-" if component == "start-up" else f"{total / rounds:.2f}"
        lines.append(f"| {component} | {cells} | {total:.1f} | {per_round} |")
    role_totals = [sum(v for (r, _), v in seconds.items() if r == role) for role in roles]
    lines.append(
        "| **all** | "
        + " | ".join(f"**{t:.1f}**" for t in role_totals)
        + f" | **{sum(role_totals):.1f}** | |"
    )
    return "\n".join(lines)


def split(seconds: dict[tuple[str, str], float]) -> tuple[float, float, float]:
    """(start-up, shared work, the rest) CPU seconds over all processes."""
    start = sum(v for (_, c), v in seconds.items() if c == "start-up")
    shared = sum(v for (_, c), v in seconds.items() if c in SHARED_WORK)
    return start, shared, sum(seconds.values()) - start - shared


def window(run_dir: Path, manifest: SwarmManifest) -> tuple[float, float]:
    """Wall times of the first node's version 1 and the last node's last version: bench_pipeline's
    window, over which its seconds per round are measured."""
    firsts, lasts = [], []
    for node in manifest.nodes:
        created = sorted(r["created_at"] for r in read_rows(run_dir / STEPS_DIR / f"{node.id}.jsonl"))
        firsts.append(created[0])
        lasts.append(created[-1])
    return min(firsts), max(lasts)


def window_table(window_cpu: dict[str, float], seconds: float, rounds: int, cpus: int) -> str:
    """CPU seconds per round of each process kind within the window, and how busy the CPUs were."""
    roles = [r for r in (*ROLES, "broker") if r in window_cpu]
    total = sum(window_cpu.values())
    head = "| " + " | ".join(roles) + " | all | busy share of the CPUs |"
    rule = "|" + "---|" * (len(roles) + 2)
    cells = " | ".join(f"{window_cpu[r] / rounds:.2f}" for r in roles)
    return f"{head}\n{rule}\n| {cells} | {total / rounds:.2f} | {total / (seconds * cpus):.0%} |"


def inner(args: argparse.Namespace) -> int:
    """The profiled process: the bench's Kafka swarm, then seconds per round into --run-dir."""
    if args.cpus:  # this process and the swarm below it, not py-spy
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
    manifest = bench_manifest(args.model, args.nodes, args.rounds)
    log = io.StringIO()
    watch = CpuWatch()
    watch.start()
    code = kafka(manifest, args.run_dir, log)
    (args.run_dir / "run.log").write_text(log.getvalue())
    if code != 0:
        return code
    cpu = watch.per_role()
    span, in_window = watch.between(*window(args.run_dir, manifest))
    measured = {
        "per_round": seconds_per_round(args.run_dir, manifest),
        "cpu": cpu,
        "processes": watch.processes(),
        "window": {"seconds": span, "rounds": args.rounds - 1, "cpu": in_window},
    }
    (args.run_dir / "measured.json").write_text(json.dumps(measured))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="warm:0", help="model ref of every node (default warm:0)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes (default 4)")
    parser.add_argument("--rounds", type=int, default=6, help="lock-step rounds, >= 2 (default 6)")
    parser.add_argument(
        "--cpus", type=int, default=1, help="pin to this many CPUs (default 1; 0 = no pinning)"
    )
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second (default 50)")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.md and collapsed.txt")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        return inner(args)
    if args.rounds < 2:
        parser.error("--rounds must be >= 2")
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy (it is in the dev extra)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="profile-round-") as tmp:
        run_dir, raw = Path(tmp) / "run", Path(tmp) / "raw.txt"
        run_dir.mkdir()
        command = [
            py_spy,
            "record",
            "--subprocesses",
            "--nonblocking",
            "--format",
            "raw",
            "--rate",
            str(args.rate),
            "-o",
            str(raw),
            "--",
            sys.executable,
            __file__,
            "--inner",
            "--run-dir",
            str(run_dir),
            "--model",
            args.model,
            "--nodes",
            str(args.nodes),
            "--rounds",
            str(args.rounds),
            "--out",
            str(args.out),
        ]
        started = time.monotonic()
        code = subprocess.run(command, check=False).returncode
        wall = time.monotonic() - started
        if code != 0 or not (run_dir / "measured.json").exists():
            raise SystemExit(f"the profiled swarm failed ({code}); see {run_dir / 'run.log'}")
        measured = json.loads((run_dir / "measured.json").read_text())
        counts = tally(raw.read_text().splitlines())
    seconds = attributed(counts, measured["cpu"])
    start, shared, rest = split(seconds)
    pinned = f"pinned to {args.cpus} CPU(s)" if args.cpus else "on all CPUs"
    summary = (
        f"{args.nodes} nodes of {args.model}, {args.rounds} rounds, {pinned}, py-spy at {args.rate} Hz: "
        f"{wall:.0f} s wall in all, {measured['per_round']:.2f} s per round (bench_pipeline's window).\n\n"
        f"CPU seconds of the whole run, per process kind from /proc, split by py-spy's samples: start-up "
        f"{start:.1f}; work the in-process run does too ({', '.join(SHARED_WORK)}) {shared:.1f}; the rest "
        f"{rest:.1f} = {rest / max(shared, 1e-9):.0%} of that work."
    )
    leaves = "\n".join(
        f"- {role}: "
        + "; ".join(f"{name} {n / args.rate:.1f} s" for name, n in counts.leaves[role].most_common(8))
        for role in ROLES
        if counts.leaves.get(role)
    )
    span, cpus = measured["window"], args.cpus or len(os.sched_getaffinity(0))
    in_window = window_table(span["cpu"], span["seconds"], span["rounds"], cpus)
    idle = ", ".join(f"{role} {n / args.rate:.1f} s" for role, n in counts.idle.most_common())
    report = (
        f"# Where a services round goes\n\n{summary}\n\n"
        f"CPU seconds per round of each process kind in bench_pipeline's window ({span['seconds']:.1f} s "
        f"from the first version 1 to the last node's last version, {span['rounds']} rounds), from /proc:\n\n"
        f"{in_window}\n\nCPU seconds of the whole run:\n\n{table(seconds, args.rounds)}\n\n"
        f"Samples of threads blocked in a wait, left out of the split: {idle or 'none'}.\n\n"
        f"After start-up, the innermost frames with most samples (sampled seconds, unscaled):\n\n{leaves}\n"
    )
    (args.out / "report.md").write_text(report)
    (args.out / "processes.json").write_text(json.dumps(measured["processes"], indent=1))
    (args.out / "collapsed.txt").write_text(
        "".join(f"{stack} {n}\n" for stack, n in counts.stacks.most_common(400))
    )
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
