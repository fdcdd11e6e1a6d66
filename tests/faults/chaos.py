"""The fault-injection driver: a swarm on a durable embedded broker while services and the broker die.

One run: tansu with `s3://` storage on the moto server (a fresh bucket), checkpoints in another fresh
bucket, every service of every node as its own process (`sapo.swarm.launcher.Swarm`, the same
environment a Kubernetes pod gets). While the nodes train their rounds, the driver SIGKILLs a random
generator, sampler or trainer at random moments and starts it again after a random pause (what a
kubelet does), and kill -9s the broker and starts it again on the same port with the same cluster id.
Nothing else intervenes: no service is told about a fault, and a service that exits on its own is an
*unplanned exit* (a failure of the run, restarted like the others so the accounting still completes).

When every node has announced its last version the swarm stops (SIGTERM), the topics are read back
and `tests.faults.ledger` accounts for every group and batch; every announced checkpoint is loaded and
verified against its digest.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sapo import storage
from sapo.broker import EmbeddedBroker
from sapo.checkpoints import load_weights, read_manifest
from sapo.kafka import Record
from sapo.kafka.dlq import H_REASON, H_SOURCE
from sapo.settings import ConsumerProfile
from sapo.storage import CheckpointError
from sapo.swarm.launcher import ServiceProcess, Swarm
from sapo.swarm.manifest import parse_manifest
from sapo.topics import TopicNames
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2
from sapo.wire import decode
from tests.faults.ledger import DeadLetter, NodeLedger, node_ledger, parse_dead_letter, totals
from tests.integration.kafka_helpers import read_topics
from tests.s3 import S3Server

MAX_BYTES = 1 << 26
PROFILE = ConsumerProfile.local_durable()
SERVICES = ("generator", "sampler", "trainer")
#: Shorter than the default 30 s so that a killed holder's successor takes over sooner.
LEASE_TTL_S = 12.0


@dataclass(frozen=True)
class ChaosPlan:
    """What one run does. The first faults cover every kind once (in random order), so even a short
    run kills each service and restarts the broker; after that each fault is drawn at random."""

    nodes: int = 1
    rounds: int = 8
    #: A random tiny model earns no reward: fine for one node, whose zero-advantage groups are kept,
    #: but a swarm needs groups with a reward spread for anything to be shared (`warm-bpe:0`).
    model: str = "tiny:1"
    seed: int = 0
    first_gap_s: tuple[float, float] = (2.0, 5.0)
    mean_gap_s: float = 10.0
    min_gap_s: float = 2.0
    broker_share: float = 0.25
    max_pause_s: float = 3.0
    deadline_s: float = 900.0
    broker_restarts_first: int = 2


@dataclass
class FaultLog:
    kills: Counter[str] = field(default_factory=Counter)
    broker_restarts: int = 0
    unplanned_exits: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class ChaosResult:
    plan: ChaosPlan
    faults: FaultLog
    ledgers: dict[str, NodeLedger]
    checkpoints_verified: int
    checkpoint_failures: list[str]

    def failures(self) -> list[str]:
        """Everything that makes the run fail; empty for a run that lost nothing."""
        out = [f"unplanned exit: {e}" for e in self.faults.unplanned_exits]
        out += self.checkpoint_failures
        if not self.checkpoints_verified:
            out.append("no announced checkpoint is left in the store to verify")
        for ledger in self.ledgers.values():
            out += [f"{ledger.node}: lost {item}" for item in ledger.lost]
            out += [f"{ledger.node}: {item}" for item in ledger.trained_twice + ledger.problems]
            if ledger.last_version < self.plan.rounds:
                out.append(f"{ledger.node}: reached version {ledger.last_version} of {self.plan.rounds}")
        return out

    def report(self) -> str:
        sums = totals(self.ledgers)
        kills = ", ".join(f"{s} {self.faults.kills[s]}" for s in SERVICES)
        lines = [
            f"fault injection: {self.plan.nodes} node(s), {self.plan.rounds} rounds, seed {self.plan.seed},"
            f" {self.faults.wall_s:.0f} s",
            f"  SIGKILLs survived: {kills}; broker kill -9 + restarts: {self.faults.broker_restarts}",
            f"  unplanned exits: {len(self.faults.unplanned_exits)}",
            f"  rollout records {sums['rollout_records']}, groups generated {sums['groups_generated']},"
            f" trained {sums['groups_trained']}, without signal (dropped by rule)"
            f" {sums['groups_without_signal']}, dead-lettered {sums['groups_dead_lettered']},"
            f" external groups trained {sums['external_groups_trained']}",
            f"  batch records {sums['batch_records']}, batches emitted {sums['batches_emitted']},"
            f" trained {sums['batches_trained']}, quarantined {sums['batches_quarantined']};"
            f" policy records {sums['policy_records']}",
            f"  checkpoints verified {self.checkpoints_verified}, failed {len(self.checkpoint_failures)}",
            f"  lost {sums['lost']}, trained twice {sums['trained_twice']},"
            f" other problems {sums['problems']}",
        ]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {
                "plan": self.plan.__dict__,
                "kills": dict(self.faults.kills),
                "broker_restarts": self.faults.broker_restarts,
                "unplanned_exits": self.faults.unplanned_exits,
                "wall_s": round(self.faults.wall_s, 1),
                "totals": totals(self.ledgers),
                "checkpoints_verified": self.checkpoints_verified,
                "failures": self.failures(),
                "events": self.faults.events,
            },
            indent=1,
        )


def _manifest(plan: ChaosPlan, bootstrap: str, prefix: str, store: str) -> object:
    sharing = plan.nodes > 1
    return parse_manifest(
        {
            "name": "chaos",
            "bootstrap": bootstrap,
            "topic_prefix": prefix,
            "defaults": {
                "model": plan.model,
                "questions_per_round": 4,
                "completions_per_question": 4,
                "local_groups": 4,  # every group with a signal is trained: nothing "unused"
                "external_groups": 2 if sharing else 0,
                "sharing": "all" if sharing else "none",
                "rounds": plan.rounds,
                "max_new_tokens": 24,
                "store": store,
                # A round waits for the node's own groups however long a restart takes, so no group
                # is late by construction and each must end in a batch.
                # Every local group is trained, signal or not (the reference's baseline), so the
                # accounting follows each one into a batch rather than into a "no signal" count.
                # The lease outlives a broker outage (pause + restart + client reconnect), as the
                # default 30 s does; a holder that cannot renew within it stops by design (fencing) and
                # is restarted, which the run would count as an unplanned exit.
                "sampler": {
                    "lockstep_local_timeout_s": 600,
                    "lease_ttl_s": LEASE_TTL_S,
                    "keep_local_zero_advantage": True,
                },
                "trainer": {"lease_ttl_s": LEASE_TTL_S},
            },
            "nodes": [{"id": f"node-{i}", "seed": 10 + i} for i in range(plan.nodes)],
        }
    )


class Driver:
    """Runs one plan; see the module docstring."""

    def __init__(self, plan: ChaosPlan, run_dir: Path, s3: S3Server, prefix: str) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.s3 = s3
        self.prefix = prefix
        self.rng = random.Random(plan.seed)
        self.faults = FaultLog()
        self._planned: set[int] = set()  # pids the driver killed

    def run(self) -> ChaosResult:
        start = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        broker = EmbeddedBroker(
            storage=f"s3://{self.s3.create_bucket('tansu')}/",
            env=self.s3.env,
            log_path=self.run_dir / "broker.log",
            start_timeout_s=30.0,
        ).start()
        store = f"s3://{self.s3.create_bucket('ckpt')}/checkpoints"
        manifest = _manifest(self.plan, broker.bootstrap, self.prefix, store)
        swarm = Swarm(manifest, self.run_dir, consumer=PROFILE, env=self.s3.env)  # type: ignore[arg-type]
        try:
            swarm.start()
            self._inject_until_done(swarm, broker)
        finally:
            swarm.stop()
            if not broker.is_running():
                broker.start()
        self.faults.wall_s = time.monotonic() - start
        try:
            ledgers, uris = self._account(swarm, broker.bootstrap)
        finally:
            broker.stop()
        verified, failures = _verify_checkpoints(uris)
        return ChaosResult(self.plan, self.faults, ledgers, verified, failures)

    def _fault_kinds(self) -> list[str]:
        first = [*SERVICES, *["broker"] * self.plan.broker_restarts_first]
        self.rng.shuffle(first)
        return first

    def _inject_until_done(self, swarm: Swarm, broker: EmbeddedBroker) -> None:
        queue = self._fault_kinds()
        deadline = time.monotonic() + self.plan.deadline_s
        while not self._done(swarm):
            if time.monotonic() > deadline:
                self._event(f"deadline of {self.plan.deadline_s} s reached")
                return
            if queue:  # the faults every run must see come early, before the last round
                gap = self.rng.uniform(*self.plan.first_gap_s)
            else:
                gap = max(self.plan.min_gap_s, self.rng.expovariate(1 / self.plan.mean_gap_s))
            if not self._watch(swarm, gap):
                return
            kind = queue.pop(0) if queue else self._draw()
            if kind == "broker":
                self._restart_broker(broker)
            else:
                self._kill_service(swarm, kind)

    def _draw(self) -> str:
        if self.rng.random() < self.plan.broker_share:
            return "broker"
        return self.rng.choice(SERVICES)

    def _watch(self, swarm: Swarm, seconds: float) -> bool:
        """Sleep `seconds` while restarting unplanned exits; False once every node is done."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for process in list(swarm.processes):
                code = process.proc.poll()
                if code is not None and process.proc.pid not in self._planned:
                    self.faults.unplanned_exits.append(f"{process.name} exited with {code}")
                    self._event(f"{process.name} exited on its own ({code}); restarting it")
                    self._respawn(swarm, process)
            if self._done(swarm):
                return False
            time.sleep(0.5)
        return True

    def _kill_service(self, swarm: Swarm, service: str) -> None:
        candidates = [p for p in swarm.processes if p.service == service and p.proc.poll() is None]
        if not candidates:
            return
        victim = self.rng.choice(candidates)
        self._planned.add(victim.proc.pid)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self.faults.kills[service] += 1
        pause = self.rng.uniform(0.0, self.plan.max_pause_s)
        self._event(f"SIGKILL {victim.name}; back after {pause:.1f} s")
        time.sleep(pause)
        self._respawn(swarm, victim)

    def _respawn(self, swarm: Swarm, process: ServiceProcess) -> None:
        node = next(n for n in swarm.manifest.nodes if n.id == process.node)
        swarm.processes.remove(process)
        swarm.processes.append(swarm.spawn(node, process.service, process.replica))

    def _restart_broker(self, broker: EmbeddedBroker) -> None:
        broker.kill()
        pause = self.rng.uniform(0.0, self.plan.max_pause_s)
        time.sleep(pause)
        broker.start()
        self.faults.broker_restarts += 1
        self._event(f"broker kill -9; back after {pause:.1f} s")

    def _done(self, swarm: Swarm) -> bool:
        assert swarm.recorder is not None
        swarm.recorder.drain()
        return all(swarm.recorder.latest.get(n.id, -1) >= self.plan.rounds for n in swarm.manifest.nodes)

    def _event(self, text: str) -> None:
        self.faults.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def _account(self, swarm: Swarm, bootstrap: str) -> tuple[dict[str, NodeLedger], set[tuple[str, str]]]:
        names = [TopicNames.for_node(node.id, self.prefix) for node in swarm.manifest.nodes]
        wanted = [t for n in names for t in (n.policy, n.rollouts, n.batches, n.dlq)]
        # Idle for four of the durable profile's fetch waits before the topics count as read whole.
        records = read_topics(bootstrap, wanted, idle_timeout_s=8.0, profile=PROFILE)
        ledgers: dict[str, NodeLedger] = {}
        uris: set[tuple[str, str]] = set()
        for topics in names:
            updates = [decode(policy_pb2.PolicyUpdate, r.value, MAX_BYTES) for r in records[topics.policy]]
            uris |= {(u.manifest_uri, u.manifest_sha256) for u in updates}
            ledgers[topics.node_id] = node_ledger(
                topics.node_id,
                [decode(rollout_pb2.RolloutGroup, r.value, MAX_BYTES) for r in records[topics.rollouts]],
                [decode(batch_pb2.TrainingBatch, r.value, MAX_BYTES) for r in records[topics.batches]],
                updates,
                [_dead_letter(r, topics.batches) for r in records[topics.dlq]],
                keeps_zero_advantage=True,
            )
        return ledgers, uris


def _dead_letter(record: Record, batches_topic: str) -> DeadLetter:
    headers = dict(record.headers.items())
    reason = headers.get(H_REASON, b"?").decode()
    source = headers.get(H_SOURCE, b"").decode().rsplit("/", 2)[0]
    return parse_dead_letter(reason, source, record.value or b"", batches_topic=batches_topic)


def _verify_checkpoints(uris: set[tuple[str, str]]) -> tuple[int, list[str]]:
    """Load every announced version the store still keeps (the trainer prunes all but the newest few),
    with its digests checked (the AWS_* variables of this process reach the store); the failures."""
    failures: list[str] = []
    verified = 0
    by_uri: dict[str, set[str]] = defaultdict(set)
    for uri, sha in uris:
        by_uri[uri].add(sha)
    for uri, shas in sorted(by_uri.items()):
        if len(shas) > 1:
            failures.append(f"{uri} announced with {len(shas)} different digests")
        if not storage.exists(storage.location(uri)):
            continue
        for sha in shas:
            try:
                manifest, directory = read_manifest(uri, sha)
                load_weights(manifest, directory)
                verified += 1
            except (CheckpointError, OSError) as exc:
                failures.append(f"checkpoint {uri}: {type(exc).__name__}: {exc}")
    return verified, failures
