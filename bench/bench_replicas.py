"""Generation rounds per hour of one node with 1 vs 2 generator replicas, each pinned to its own core.

What is timed is generation alone: no trainer and no sampler run, so a GRPO step never holds the
replicas back. Each run starts a fresh embedded broker and the node's generator replicas as the
launcher starts them (`Swarm.spawn`: real `services.generator.main` processes, one consumer group over
the node's work topic), replica i pinned to the i-th core this process may use (the launching thread
pins itself while the child is forked, so the child and every thread it starts inherit the mask), with
OMP_NUM_THREADS=1. The broker and this process are not pinned. Policy version 0 is the model ref's
weights, which a replica holds from its start (the trainer's version-0 announcement loads nothing), so
no checkpoint is written.

Once every replica has been assigned its share of the work topic's partitions and a fresh consumer
group reads the node's rollout topic, the clock starts and the trainer's own `WorkPlanner` publishes
the items of all R rounds at once (async pacing, max_ahead = R: every item needs version 0 only). The
clock stops when the last distinct (round, position) group is read back; rounds per hour = R / that
time * 3600. Start-up (model load, group joins) is outside the window. Each replica samples at most
one round's worth of items per backend call (max_batch_items = B), so both configurations run
calls of B x L sequences; items, seeds and group ids are functions of (node, round, position), so
both generate the same groups: the completion tokens printed per run match up to the floating-point
differences of another batch composition. Distinct
(round, position) pairs, records read and group ids per pair show that no item was sampled twice.
Each replica's CPU seconds over the window / the window is printed as "busy": near 100% means nothing
else (the broker, this process, other jobs on the machine) took its core.

The order of the two configurations alternates with --repeats; medians are compared. A run that has
not finished within --max-seconds (start-up included) is reported as stalled and left out; every
replica and the broker are stopped (SIGTERM, then SIGKILL) whatever happens.

Target: rounds/h with 2 replicas >= 1.7 x rounds/h with 1.

Even on an idle machine 2x is out of reach: the later replica sets the end, and the unpinned broker
and this process's reader run on the replicas' cores, where the 1-replica baseline leaves them a free
core. Other jobs that hold a core slow the 1-replica runs and inflate the ratio: read the busy column
before the ratio.

    .venv/bin/python bench/bench_replicas.py [--model bundled:smollm2-135m-instruct] [--rounds 2] \\
        [--questions 8] [--completions 8] [--max-new-tokens 24] [--repeats 3]

Quick check of the script itself (a random tiny model, seconds per run):

    .venv/bin/python bench/bench_replicas.py --model tiny:0 --rounds 2 --repeats 1

What it read: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from sapo.broker import EmbeddedBroker
from sapo.generator.work import Pacing, PacingMode
from sapo.kafka import ConsumerLoop, Disposition, KafkaPublisher, Record, TransportMetrics
from sapo.kafka.consumer import DEFAULT_MAX_PAYLOAD_BYTES, KafkaConsumerClient
from sapo.lifecycle import StopFlag
from sapo.models import BUNDLED_REF
from sapo.node.planner import WorkPlanner
from sapo.settings import ConsumerProfile
from sapo.swarm.launcher import ServiceProcess, Swarm
from sapo.swarm.manifest import SwarmManifest, parse_manifest
from sapo.topics import WORK_PARTITIONS, TopicNames, ensure_topics
from sapo.v1 import rollout_pb2
from sapo.wire import decode

TARGET_RATIO = 1.7
CONFIGS = (1, 2)
"""Replicas per run: the baseline and the scaled-out node."""
NODE = "node-a"
DRAIN_S = 2.0
"""Read on this long after the last group, so that an item sampled twice would still be counted."""


def bench_manifest(args: argparse.Namespace, replicas: int) -> SwarmManifest:
    """One node, `replicas` generators, B x L a round, one round's items per backend call."""
    defaults = {
        "model": args.model,
        "rounds": args.rounds,
        "questions_per_round": args.questions,
        "completions_per_question": args.completions,
        "max_new_tokens": args.max_new_tokens,
        "generator_replicas": replicas,
        "generator": {"max_batch_items": args.questions},
    }
    return parse_manifest(
        {"name": "bench-replicas", "defaults": defaults, "nodes": [{"id": NODE, "seed": args.seed}]}
    )


@contextmanager
def pinned(core: int) -> Iterator[None]:
    """The calling thread on `core` only, restored on exit: a child forked meanwhile inherits the mask
    before it runs anything, so none of its threads (torch's, librdkafka's) ever runs elsewhere."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def gauge(process: ServiceProcess, name: str) -> float | None:
    """A sample of the process's /metrics; None while it serves none."""
    url = process.metrics_url
    if url is None:
        return None
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Rollouts:
    """The node's rollout topic read by a fresh consumer group: when each (round, position) first
    arrived, the group ids seen for it, records read, and the completion tokens of first copies."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.first_seen: dict[tuple[int, int], float] = {}
        self.ids: dict[tuple[int, int], set[str]] = defaultdict(set)
        self.records = 0
        self.tokens = 0
        config = {"bootstrap.servers": bootstrap} | ConsumerProfile.local().to_librdkafka()
        self.loop = ConsumerLoop(
            KafkaConsumerClient(config, f"{topic}.bench"),
            [topic],
            self._keep,
            stop=StopFlag(),
            metrics=TransportMetrics(CollectorRegistry(), "bench"),
            poll_timeout_s=0.2,
        )

    def _keep(self, record: Record) -> Disposition:
        group = decode(rollout_pb2.RolloutGroup, record.value, DEFAULT_MAX_PAYLOAD_BYTES)
        slot = (group.round, group.position)
        self.records += 1
        self.ids[slot].add(group.group_id)
        if slot not in self.first_seen:
            self.first_seen[slot] = time.monotonic()
            self.tokens += sum(len(c.token_ids) for c in group.completions)
        return Disposition.DONE


class StallError(RuntimeError):
    """A run that did not finish within --max-seconds, or a replica that exited."""


def check_alive(processes: Sequence[ServiceProcess]) -> None:
    for p in processes:
        if p.proc.poll() is not None:
            tail = "\n".join(p.log_path.read_text().splitlines()[-15:])
            raise StallError(f"{p.name} exited with status {p.proc.returncode}; its log ends:\n{tail}")


def wait_ready(processes: Sequence[ServiceProcess], rollouts: Rollouts, deadline: float) -> None:
    """Every replica holds a share of the work partitions (the group is settled: no rebalance
    mid-run) and the rollout reader has its partitions."""
    while True:
        check_alive(processes)
        shares = [gauge(p, "sapo_generator_work_partitions") or 0 for p in processes]
        if all(shares) and sum(shares) == WORK_PARTITIONS and rollouts.loop.assigned:
            return
        if time.monotonic() > deadline:
            raise StallError(f"replicas not ready (work partitions held: {shares}) within --max-seconds")
        rollouts.loop.step(0.5)


@dataclass
class Run:
    replicas: int
    cores: list[int]
    start_s: float = 0.0  # spawn -> every replica assigned its partitions
    seconds: float | None = None  # first work item -> last distinct group read; None: stalled
    busy: list[float] = field(default_factory=list)  # per replica: CPU seconds / window
    groups: int = 0
    records: int = 0
    ids_per_slot: int = 0
    tokens: int = 0

    def rounds_per_hour(self, rounds: int) -> float | None:
        return None if self.seconds is None else rounds / self.seconds * 3600


def time_rounds(
    swarm: Swarm, rollouts: Rollouts, args: argparse.Namespace, run: Run, deadline: float
) -> None:
    """Publish every round's items, then read until every group arrived; fill in `run`."""
    topics = TopicNames.for_node(NODE, swarm.manifest.topic_prefix)
    planner = WorkPlanner(
        KafkaPublisher({"bootstrap.servers": swarm.bootstrap}),
        topics.work,
        NODE,
        per_round=args.questions,
        pacing=Pacing(PacingMode.ASYNC, max_ahead=args.rounds, rounds=args.rounds),
        flush_timeout_s=30,
    )
    pids = [p.proc.pid for p in swarm.processes]
    cpu_before = [cpu_seconds(pid) for pid in pids]
    clock = time.monotonic()
    planner.plan(0)
    expected = args.rounds * args.questions
    while len(rollouts.first_seen) < expected:
        check_alive(swarm.processes)
        if time.monotonic() > deadline:
            raise StallError(f"{len(rollouts.first_seen)} of {expected} groups within --max-seconds")
        rollouts.loop.step(0.05)
    run.seconds = max(rollouts.first_seen.values()) - clock
    run.busy = [
        (cpu_seconds(pid) - before) / run.seconds for pid, before in zip(pids, cpu_before, strict=True)
    ]
    drained = time.monotonic() + DRAIN_S
    while time.monotonic() < drained:
        rollouts.loop.step(0.1)
    run.groups, run.records, run.tokens = len(rollouts.first_seen), rollouts.records, rollouts.tokens
    run.ids_per_slot = max(len(ids) for ids in rollouts.ids.values())


def measure(args: argparse.Namespace, replicas: int, run_dir: Path) -> Run:
    """One run: broker, replicas, the rounds' items, the groups read back; everything stopped after."""
    manifest = bench_manifest(args, replicas)
    run = Run(replicas, sorted(os.sched_getaffinity(0))[:replicas])
    begun = time.monotonic()
    deadline = begun + args.max_seconds
    for sub in ("logs", "ports"):
        (run_dir / sub).mkdir(parents=True)
    broker = EmbeddedBroker(log_path=run_dir / "logs" / "broker.log").start()
    swarm = Swarm(manifest, run_dir, broker=broker, bootstrap=broker.bootstrap)
    rollouts: Rollouts | None = None
    try:
        topics = TopicNames.for_node(NODE, manifest.topic_prefix)
        ensure_topics({"bootstrap.servers": broker.bootstrap}, topics.specs(), timeout_s=30)
        spawned = time.monotonic()
        for replica, core in enumerate(run.cores):
            with pinned(core):
                swarm.processes.append(swarm.spawn(manifest.nodes[0], "generator", replica))
        masks = [os.sched_getaffinity(p.proc.pid) for p in swarm.processes]
        assert masks == [{core} for core in run.cores], masks
        rollouts = Rollouts(broker.bootstrap, topics.rollouts)
        rollouts.loop.open()
        wait_ready(swarm.processes, rollouts, deadline)
        run.start_s = time.monotonic() - spawned
        time_rounds(swarm, rollouts, args, run, deadline)
    except StallError as exc:
        stalled = f"STALLED after {time.monotonic() - begun:.0f} s: {exc}"
        logs = run_dir / "logs" if args.keep else "--keep DIR keeps the logs"
        print(f"  {replicas} replica(s): {stalled} ({logs})", flush=True)
    finally:
        if rollouts is not None:
            rollouts.loop.close()
        swarm.stop(grace_s=30)  # the replicas (SIGTERM, SIGKILL after 30 s), then the broker
    return run


def report(run: Run, rounds: int) -> None:
    rate = run.rounds_per_hour(rounds)
    if rate is None or run.seconds is None:
        return
    busy = ", ".join(f"{b:.0%}" for b in run.busy)
    print(
        f"  {run.replicas} replica(s) on cores {run.cores}: {rounds} rounds in {run.seconds:6.1f} s = "
        f"{rate:7.0f} rounds/h   groups {run.groups} distinct of {run.records} read, "
        f"{run.ids_per_slot} id per (round, position); {run.tokens} completion tokens; "
        f"busy {busy}; start-up {run.start_s:.0f} s",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=BUNDLED_REF, help="model ref of the node (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="R, rounds per run (default: %(default)s)")
    parser.add_argument(
        "--questions",
        type=int,
        default=WORK_PARTITIONS,
        help="B, questions a round, a multiple of the work partitions (default: %(default)s)",
    )
    parser.add_argument("--completions", type=int, default=8, help="L, per question (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=24, help="per completion (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=1, help="the node's seed (default: %(default)s)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per config, alternating (default: %(default)s)"
    )
    parser.add_argument("--max-seconds", type=float, default=600, help="cap per run (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="keep the run directories (logs) under this directory")
    args = parser.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be >= 1")
    if args.questions < 1 or args.questions % WORK_PARTITIONS:
        # item i goes to partition i % WORK_PARTITIONS: other sizes split a round unevenly
        parser.error(f"--questions must be a multiple of {WORK_PARTITIONS}, the work topic's partitions")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < max(CONFIGS):
        parser.error(f"needs {max(CONFIGS)} cores to pin replicas to; this process may use {cores}")
    os.environ["OMP_NUM_THREADS"] = "1"  # one torch thread per replica: its pinned core
    print(
        f"{args.model}: {args.rounds} rounds of {args.questions} x {args.completions}, "
        f"<= {args.max_new_tokens} new tokens, {os.cpu_count()} cores, replicas pinned to cores {cores[:2]}"
    )
    runs: dict[int, list[Run]] = {n: [] for n in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        root = args.keep or Path(tmp)
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}:", flush=True)
            for replicas in CONFIGS if repeat % 2 == 0 else tuple(reversed(CONFIGS)):
                run = measure(args, replicas, root / f"{replicas}-replicas-{repeat}")
                report(run, args.rounds)
                runs[replicas].append(run)
    rates = {
        n: [r for r in (run.rounds_per_hour(args.rounds) for run in runs[n]) if r is not None]
        for n in CONFIGS
    }
    if not all(rates.values()):
        print("FAIL: no ratio, a configuration stalled in every run (see above)")
        return 1
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    ratio = two / one
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    counts = f"medians of {len(rates[1])} and {len(rates[2])} runs"
    print(f"\n1 replica {one:.0f} rounds/h, 2 replicas {two:.0f} rounds/h ({counts})")
    print(f"{verdict}: ratio 2 / 1 replicas = {ratio:.2f} (target >= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    logging.getLogger("sapo.librdkafka").setLevel(logging.CRITICAL)
    raise SystemExit(main())
