"""Load: a simulated 1,000-node swarm publishing signed groups at the paper's per-round rate into one
real sampler process; does it keep up, and where does its memory stop?

The swarm: `--nodes` node ids, each with its own Ed25519 key (`sapo.identity.NodeKey`), sharing all
B=8 groups of every round (the paper's setting), signed by their node (`Signer`). Groups are
bench_sampler's real RolloutGroups (a fresh question from each node's easy-profile stream per
group, 8 completions, prompt ids, per-token logprobs: ~2.4 KB). Rounds last `--round-s` (default
10 s: a fast GPU swarm; CPU rounds take tens of seconds), so the offered load is
nodes x 8 / round_s groups/s (800/s at the defaults). Nodes are not in step: node n publishes its
8 groups at (n + 1/2) / nodes of each round, so the load is spread over the round, as it is when
generation times differ. The receiving node's own generator is simulated too: its 8 local groups
per round go to its rollout topic at the start of the round (unsigned, as a node's own topics are).

The publisher is a separate process (so the sampler's memory is its own); it builds and signs every
message before the clock starts, so during the run it only sends (the 1,000 senders are other
machines). The sampler is the real service, `python -m services.sampler.main`, configured through
SAPO_SAMPLER_* as a Deployment would be: identity `strict` with a trust list of all the nodes' keys,
async rounds of I=4/J=4 (a batch as soon as 4 local and 4 external groups are in: 2 per round, no
trainer or generator needed), eager verification by default (the service's default; `--verify
lazy`), every memory bound at the service's default (max_pool_groups 4,096 per origin,
dedupe_capacity 200,000). Everything else is read from its /metrics every second: groups consumed
and rejected (by reason), the pool size, the consumer lag gauge (librdkafka statistics every 1 s),
process CPU and resident memory; its peak RSS also from /proc (VmHWM) before it is stopped.

Baseline, same run: the same load with identity off (the same groups, unsigned, into a fresh sampler
on fresh topics) for `--baseline-rounds` rounds; reported as CPU seconds per group, signed/unsigned.

PASS when the signed sampler kept up (every produced group consumed within `--grace-s` after the
last round, so the backlog returned to 0, and at least 95% consumed by the end of the last round)
and its peak RSS stayed under `--max-rss-mib` (default 2,048: the Helm chart's memory limit of the
sampler container). The pool is full after the first seconds, so what still grows is the dedupe set,
bounded by its capacity: the run also prints RSS growth per consumed group after the first round,
extrapolated to the capacity (the ceiling at these settings).

Every child process is stopped in `finally`; `--max-seconds` bounds the whole run. At the defaults a
run takes about 6 minutes on two cores, building and signing the groups included.

    .venv/bin/python bench/bench_swarm_load.py [--nodes 1000] [--round-s 10] [--rounds 15]

What it read, at 1,000 and 10,000 nodes, as the sampler changed: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from bench_sampler import build_group
from prometheus_client.parser import text_string_to_metric_families

from sapo.broker import EmbeddedBroker
from sapo.identity import NodeKey, Signer, public_text
from sapo.identity.trustlist import TrustList, save_trust_list
from sapo.kafka import KafkaPublisher
from sapo.kafka.records import Header
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConsumerProfile
from sapo.tasks import EASY_PROFILE, TaskStream
from sapo.topics import TopicNames, ensure_topics
from sapo.wire import rollout_headers

ROOT = Path(__file__).resolve().parents[1]
RECEIVER = "receiver"
_DEFAULTS = SamplerSettings.model_fields
MAX_POOL: int = _DEFAULTS["max_pool_groups"].default  # the service's defaults, which the run keeps
DEDUPE: int = _DEFAULTS["dedupe_capacity"].default
B = 8  # groups per node and round (the paper's questions per round, all shared)
Message = tuple[bytes, bytes, list[Header], list[Header]]  # key, value, unsigned and signed headers


@dataclass
class Swarm:
    """Every message of the run, built and signed up front: per round, the swarm's in sending order
    (node by node) and the receiver's own."""

    publics: dict[str, str]
    external: list[list[Message]]
    local: list[list[Message]]


def build_swarm(nodes: int, rounds: int, seed: int) -> Swarm:
    rng = random.Random(seed)
    signers = [Signer(NodeKey.generate()) for _ in range(nodes)]
    streams = [TaskStream(EASY_PROFILE, node_seed=n, split="train") for n in range(nodes)]
    own = TaskStream(EASY_PROFILE, node_seed=10**6, split="train")

    def message(node: str, stream: TaskStream, signer: Signer | None) -> Message:
        group = build_group(node, stream, rng)
        value = group.SerializeToString()
        headers = rollout_headers(group, value)
        signed = signer.sign_headers(headers, value) if signer is not None else headers
        return group.group_id.encode(), value, headers, signed

    external = [
        [message(f"node-{n}", streams[n], signers[n]) for n in range(nodes) for _ in range(B)]
        for _ in range(rounds)
    ]
    local = [[message(RECEIVER, own, None) for _ in range(B)] for _ in range(rounds)]
    publics = {f"node-{n}": public_text(s.key.public) for n, s in enumerate(signers)}
    return Swarm(publics, external, local)


def publisher(conn: Connection, bootstrap: str, nodes: int, rounds: int, seed: int) -> None:
    """The swarm's process: build, then publish one phase per command until told None."""
    started = time.perf_counter()
    swarm = build_swarm(nodes, rounds, seed)
    size = sum(len(m[1]) for m in swarm.external[0]) / len(swarm.external[0])
    conn.send((swarm.publics, size, time.perf_counter() - started))
    pub = KafkaPublisher({"bootstrap.servers": bootstrap, "linger.ms": "20"})
    while (command := conn.recv()) is not None:
        prefix, signed, phase_rounds, round_s = command
        topics = TopicNames.for_node(RECEIVER, prefix)
        publish(conn, pub, swarm, topics, signed=signed, rounds=phase_rounds, round_s=round_s)


def publish(
    conn: Connection,
    pub: KafkaPublisher,
    swarm: Swarm,
    topics: TopicNames,
    *,
    signed: bool,
    rounds: int,
    round_s: float,
) -> None:
    """Send each round's messages at their nodes' phases; report progress every 0.5 s and each round's
    end as ("progress" | "round", wall time, external groups sent), then ("done", time, sent, errors)."""
    start, sent, reported = time.time(), 0, 0.0
    for r in range(rounds):
        for key, value, _, headers in swarm.local[r]:
            pub.send(topics.rollouts, key, value, headers)
        messages = swarm.external[r]
        for i, (key, value, unsigned, headers) in enumerate(messages):
            due = start + (r + (i // B + 0.5) * B / len(messages)) * round_s
            while (now := time.time()) < due:
                pub.poll(min(0.005, due - now))
            pub.send(topics.swarm_rollouts, key, value, headers if signed else unsigned)
            sent += 1
            if now - reported >= 0.5:
                conn.send(("progress", now, sent))
                reported = now
        while time.time() < start + (r + 1) * round_s:
            pub.poll(0.005)
        conn.send(("round", time.time(), sent))
    pub.flush(60)
    conn.send(("done", time.time(), sent, pub.errors))


@dataclass
class Sample:
    """One scrape of the sampler's /metrics."""

    t: float
    consumed: float  # external groups read
    rejected: dict[str, float]
    pool: float  # external groups pooled
    lag: float  # swarm partitions' unread messages (librdkafka statistics)
    rss: float
    cpu: float
    batches: float


def scrape(url: str, swarm_topic: str) -> Sample:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    s = Sample(time.time(), 0.0, {}, 0.0, 0.0, 0.0, 0.0, 0.0)
    for family in text_string_to_metric_families(text):
        for m in family.samples:
            if m.name == "sapo_sampler_groups_consumed_total" and m.labels["origin"] == "external":
                s.consumed = m.value
            elif m.name == "sapo_sampler_groups_rejected_total" and m.value:
                s.rejected[m.labels["reason"]] = m.value
            elif m.name == "sapo_sampler_pool_groups" and m.labels["origin"] == "external":
                s.pool = m.value
            elif m.name == "sapo_sampler_consumer_lag_messages" and m.labels["topic"] == swarm_topic:
                s.lag += m.value
            elif m.name == "process_resident_memory_bytes":
                s.rss = m.value
            elif m.name == "process_cpu_seconds_total":
                s.cpu = m.value
            elif m.name == "sapo_sampler_batches_emitted_total":
                s.batches = m.value
    return s


def sampler_env(
    bootstrap: str, prefix: str, workdir: Path, verify: str, trust: Path | None
) -> dict[str, str]:
    profile = ConsumerProfile.local()
    env = {
        "NODE_ID": RECEIVER,
        "KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "TOPIC_PREFIX": prefix,
        "CONSUMER__SESSION_TIMEOUT_MS": str(profile.session_timeout_ms),
        "CONSUMER__HEARTBEAT_INTERVAL_MS": str(profile.heartbeat_interval_ms),
        "CONSUMER__FETCH_WAIT_MAX_MS": str(profile.fetch_wait_max_ms),
        "CONSUMER__STATISTICS_INTERVAL_MS": "1000",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": "0",
        "HTTP_PORT_FILE": str(workdir / f"{prefix}.port"),
        "LOG_FORMAT": "text",
        "ROUND_MODE": "async",
        "LOCAL_GROUPS": "4",
        "EXTERNAL_GROUPS": "4",
        "VERIFY": verify,
        "MAX_POLICY_LAG": "1000000",  # no trainer: the local groups keep policy version 0
        "RECOVERY_IDLE_S": "1.5",
    }
    if trust is not None:
        env |= {"IDENTITY__MODE": "strict", "IDENTITY__TRUST_FILE": str(trust)}
    return os.environ | {"PYTHONPATH": str(ROOT)} | {f"SAPO_SAMPLER_{k}": v for k, v in env.items()}


@dataclass
class Phase:
    """What one phase measured."""

    label: str
    samples: list[Sample] = field(default_factory=list)
    rounds: list[tuple[float, int]] = field(default_factory=list)  # (end time, external groups sent)
    max_backlog: int = 0
    start: float = 0.0
    done: float = 0.0
    produced: int = 0
    errors: int = 0
    caught_up: float | None = None
    hwm_mib: float = 0.0

    def rate(self) -> tuple[float, float]:
        """Offered and consumed groups/s: from the first send to the last send, or to the time the
        sampler had read everything (or the end)."""
        end = self.caught_up or self.samples[-1].t
        return self.produced / (self.done - self.start), self.samples[-1].consumed / (end - self.start)

    def at(self, t: float) -> Sample:
        """The last scrape at or before `t` (so a backlog read from it is never negative)."""
        return max((s for s in self.samples if s.t <= t), key=lambda s: s.t, default=self.samples[0])


def wait_ready(proc: subprocess.Popen[bytes], port_file: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if port_file.exists():
            base = f"http://127.0.0.1:{int(port_file.read_text())}"
            # /readyz answers 503 (an OSError here) until the sampler recovered and was assigned.
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return f"{base}/metrics"
        time.sleep(0.2)
    raise RuntimeError(f"the sampler was not ready within {timeout_s} s (exit code {proc.poll()})")


def run_phase(
    conn: Connection, bootstrap: str, *, signed: bool, args: argparse.Namespace, workdir: Path
) -> Phase:
    """One sampler process on fresh topics, fed one phase of the publisher, scraped every second."""
    label = "signed" if signed else "unsigned"
    rounds = args.rounds if signed else args.baseline_rounds
    prefix = f"load-{label}"
    topics = TopicNames.for_node(RECEIVER, prefix)
    ensure_topics({"bootstrap.servers": bootstrap}, topics.specs(), timeout_s=30)
    trust = workdir / "trust.yaml" if signed else None
    env = sampler_env(bootstrap, prefix, workdir, args.verify, trust)
    log = (workdir / f"{prefix}.log").open("wb")
    cmd = [sys.executable, "-m", "services.sampler.main"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    phase = Phase(label)
    try:
        url = wait_ready(proc, workdir / f"{prefix}.port", timeout_s=90)
        phase.samples.append(scrape(url, topics.swarm_rollouts))
        conn.send((prefix, signed, rounds, args.round_s))
        phase.start, produced_now = time.time(), 0
        deadline = phase.start + rounds * args.round_s + args.grace_s
        while time.time() < min(deadline, args.deadline):
            while conn.poll():
                kind, t, sent, *rest = conn.recv()
                produced_now = sent
                if kind == "round":
                    phase.rounds.append((t, sent))
                elif kind == "done":
                    phase.done, phase.produced, phase.errors = t, sent, rest[0]
            sample = scrape(url, topics.swarm_rollouts)
            phase.samples.append(sample)
            phase.max_backlog = max(phase.max_backlog, int(produced_now - sample.consumed))
            if phase.done and sample.consumed >= phase.produced:
                phase.caught_up = sample.t
                break
            time.sleep(max(0.0, 1.0 - (time.time() - sample.t)))
        phase.hwm_mib = vm_hwm_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    if not phase.done:
        raise RuntimeError(f"{label}: the publisher did not finish before --max-seconds")
    return phase


def vm_hwm_mib(pid: int) -> float:
    """Peak resident memory of a live process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def report(signed: Phase, unsigned: Phase, args: argparse.Namespace) -> None:
    mib = 1 / (1 << 20)
    print(f"\n{'round':>5} {'sent':>7} {'backlog':>7} {'lag':>5} {'pool':>5} {'RSS MiB':>7} {'cores':>5}")
    previous = signed.samples[0]
    for r, (t, sent) in enumerate(signed.rounds):
        s = signed.at(t)
        cores = (s.cpu - previous.cpu) / max(1e-9, s.t - previous.t)
        line = f"{r:>5} {sent:>7} {sent - s.consumed:>7.0f} {s.lag:>5.0f} {s.pool:>5.0f} {s.rss * mib:>7.0f}"
        print(f"{line} {cores:>5.2f}")
        previous = s
    last = signed.samples[-1]
    offered, consumed = signed.rate()
    print(f"\noffered  {offered:6.0f} groups/s ({args.nodes} nodes x {B} per {args.round_s:g} s round)")
    print(f"consumed {consumed:6.0f} groups/s ({last.consumed:.0f} of {signed.produced} produced)")
    print(
        f"max backlog {signed.max_backlog} groups (produced - consumed, 1 s scrapes); lag gauge max "
        f"{max(s.lag for s in signed.samples):.0f}, final {last.lag:.0f}"
    )
    end_round = signed.at(signed.rounds[-1][0]).consumed / max(1, signed.produced)
    if signed.caught_up is not None:
        print(f"caught up {signed.caught_up - signed.done:.1f} s after the last send", end="; ")
    else:
        print(f"NOT caught up within {args.grace_s:g} s", end="; ")
    print(f"{100 * end_round:.1f}% consumed by the end of the last round")
    print(f"rejected by reason: {dict(sorted(last.rejected.items()))}; batches emitted {last.batches:.0f}")
    peak = max(signed.hwm_mib, max(s.rss for s in signed.samples) * mib)
    idle = signed.samples[0].rss * mib
    print(
        f"peak RSS {peak:.0f} MiB (VmHWM of the sampler process; {idle:.0f} MiB when ready, before any group)"
    )
    ends = [signed.at(t) for t, _ in signed.rounds]
    full = next((r for r, s in enumerate(ends) if s.pool >= MAX_POOL), None)
    if full is not None and last.consumed > ends[full].consumed:
        at = ends[full]
        per_group = (last.rss - at.rss) / (last.consumed - at.consumed)
        ceiling = last.rss * mib + per_group * max(0.0, DEDUPE - last.consumed) * mib
        print(
            f"pool full ({MAX_POOL}) by the end of round {full}: RSS {at.rss * mib:.0f} MiB then, "
            f"{per_group:.0f} B per group consumed since -> ~{ceiling:.0f} MiB once the dedupe set holds "
            f"its {DEDUPE:,} ids"
        )
    cpu = {
        p.label: (p.samples[-1].cpu - p.samples[0].cpu) / max(1.0, p.samples[-1].consumed)
        for p in (signed, unsigned)
    }
    base = "caught up" if unsigned.caught_up else "NOT caught up"
    print(
        f"CPU per group: signed {1e3 * cpu['signed']:.2f} ms, unsigned {1e3 * cpu['unsigned']:.2f} ms "
        f"(identity off, {len(unsigned.rounds)} rounds, {base}): signed / unsigned "
        f"{cpu['signed'] / cpu['unsigned']:.2f} x"
    )
    kept_up = signed.caught_up is not None and end_round >= 0.95 and signed.errors == 0
    ok = kept_up and peak < args.max_rss_mib
    verdict = "kept up" if kept_up else "did not keep up"
    print(
        f"{'PASS' if ok else 'FAIL'}: {verdict} with {offered:.0f} signed groups/s from {args.nodes} nodes; "
        f"peak RSS {peak:.0f} MiB (bound {args.max_rss_mib:g} MiB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--round-s", type=float, default=10.0, help="round period (10 s: a fast GPU swarm)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--baseline-rounds", type=int, default=4, help="rounds of the unsigned baseline")
    parser.add_argument("--verify", choices=("eager", "lazy"), default="eager")
    parser.add_argument("--grace-s", type=float, default=30.0, help="to catch up after the last round")
    parser.add_argument("--max-rss-mib", type=float, default=2048.0, help="the chart's sampler limit")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="give up after this long")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.deadline = time.time() + args.max_seconds
    started = time.perf_counter()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    ctx = mp.get_context("spawn")  # a fresh interpreter: none of this process's memory or threads
    ours, theirs = ctx.Pipe()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rounds = max(args.rounds, args.baseline_rounds)
        proc = ctx.Process(target=publisher, args=(theirs, broker.bootstrap, args.nodes, rounds, args.seed))
        proc.start()
        try:
            publics, size, took = ours.recv()
            print(
                f"built and signed {rounds * args.nodes * B} groups of {size:.0f} B from {args.nodes} "
                f"nodes in {took:.0f} s"
            )
            save_trust_list(workdir / "trust.yaml", TrustList(nodes={n: (k,) for n, k in publics.items()}))
            unsigned = run_phase(ours, broker.bootstrap, signed=False, args=args, workdir=workdir)
            signed = run_phase(ours, broker.bootstrap, signed=True, args=args, workdir=workdir)
            ours.send(None)
            proc.join(10)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join()
    report(signed, unsigned, args)
    print(f"load average {os.getloadavg()[0]:.1f}; total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
