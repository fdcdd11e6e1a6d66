"""Runs a swarm on one machine: the embedded broker (unless one is given) and, per node, its
generator, sampler and trainer as separate processes that talk only through Kafka.

Each process gets its settings through the same environment variables a Kubernetes Deployment
would set, its own /metrics port, and a log file in the run directory. The generators' and trainers'
model calls share one compute gate in the run directory, a slot per CPU (`sapo.cpugate`). Stopping
sends SIGTERM to every process (generators first, trainers last so their final checkpoint lands),
waits, and kills what is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo.broker import EmbeddedBroker
from sapo.cpugate import omp_threads, slots_for, usable_cpus
from sapo.malloc import with_malloc_tunable
from sapo.settings import ConsumerProfile
from sapo.swarm.manifest import (
    NodeSpec,
    Service,
    SwarmManifest,
    resolve,
    service_values,
    sharing_peers,
    swarm_profiles,
)
from sapo.swarm.recorder import SwarmRecorder
from sapo.topics import TopicNames, ensure_topics

START_ORDER: tuple[Service, ...] = ("trainer", "sampler", "generator")
STOP_ORDER: tuple[Service, ...] = ("generator", "sampler", "trainer")
STOP_GRACE_S = 60.0
GATED: tuple[Service, ...] = ("generator", "trainer")
"""The services whose model calls go through the machine's compute gate (`sapo.cpugate`)."""


@dataclass
class ServiceProcess:
    node: str
    service: Service
    replica: int
    port_file: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def name(self) -> str:
        """`node-a-trainer`, or `node-a-generator-1` for a node with several generator replicas."""
        return f"{self.node}-{self.service}" + (f"-{self.replica}" if self.replica else "")

    @property
    def metrics_url(self) -> str | None:
        """None until the service has bound its ops port (it picks a free one and writes it down)."""
        try:
            return f"http://127.0.0.1:{int(self.port_file.read_text())}/metrics"
        except (OSError, ValueError):
            return None


def _env_name(service: str, key: str) -> str:
    return f"SAPO_{service.upper()}_{key.upper()}"


def flatten_env(service: str, values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Settings values as the env variables pydantic-settings reads (nested keys joined by `__`)."""
    env: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            env |= flatten_env(service, value, f"{name}__")
        elif isinstance(value, list | tuple):
            env[_env_name(service, name)] = json.dumps(list(value))
        elif isinstance(value, bool):
            env[_env_name(service, name)] = "true" if value else "false"
        elif value is not None:
            env[_env_name(service, name)] = str(value)
    return env


@dataclass
class Swarm:
    manifest: SwarmManifest
    run_dir: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    broker: EmbeddedBroker | None = None
    bootstrap: str = ""
    recorder: SwarmRecorder | None = None
    #: Consumer timing of every process; None: the embedded broker's when the swarm starts its own,
    #: the defaults for a given bootstrap.
    consumer: ConsumerProfile | None = None
    #: Added to every service's environment (storage credentials, for one).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        (self.run_dir / "ports").mkdir(exist_ok=True)
        (self.run_dir / "manifest.json").write_text(self.manifest.model_dump_json(indent=1))
        if self.manifest.bootstrap:
            self.bootstrap = self.manifest.bootstrap
        else:
            self.broker = EmbeddedBroker(log_path=self.run_dir / "logs" / "broker.log").start()
            self.bootstrap = self.broker.bootstrap
        names = [TopicNames.for_node(n.id, self.manifest.topic_prefix) for n in self.manifest.nodes]
        # A work topic partition per generator replica, not the chart's room to scale to eight: the
        # launcher's replicas are fixed, and every assigned partition costs the embedded broker CPU on
        # each fetch even when empty (~0.2 ms, docs/architecture.md).
        specs = [
            spec
            for node, topics in zip(self.manifest.nodes, names, strict=True)
            for spec in topics.specs(work_partitions=node.generator_replicas)
        ]
        ensure_topics({"bootstrap.servers": self.bootstrap}, specs, timeout_s=30)
        self.recorder = SwarmRecorder(
            self._recorder_config(),
            [t.policy for t in names],
            [t.rollouts for t in names],
            self.run_dir,
            # Stable, so a launcher started again on the same swarm resumes its record where it was;
            # under the topic prefix, so two swarms of one name on a cluster never share the group.
            group=f"{self.manifest.topic_prefix}.{self.manifest.name}.recorder",
            questions_per_round={
                n.id: resolve(self.manifest, n, self.checkpoints).sampler.questions_per_round
                for n in self.manifest.nodes
            },
        )
        for node in self.manifest.nodes:
            for service in START_ORDER:
                replicas = node.generator_replicas if service == "generator" else 1
                self.processes += [self.spawn(node, service, r) for r in range(replicas)]

    def _consumer_profile(self) -> ConsumerProfile | None:
        """The explicit profile, else the embedded broker's, else None (each service's defaults)."""
        return self.consumer or (ConsumerProfile.local_swarm() if self.broker is not None else None)

    def _recorder_config(self) -> dict[str, str]:
        """The recorder only watches (no round waits on it): its fetches wait the watchers' time."""
        profile = self._consumer_profile() or ConsumerProfile()
        return {"bootstrap.servers": self.bootstrap} | profile.to_librdkafka(watch=True)

    def _wiring(self, node: NodeSpec, service: Service, name: str, port_file: Path) -> dict[str, str]:
        """What only the launcher can decide for a process: which node it is, where its broker and
        ports are."""
        values: dict[str, Any] = {
            "node_id": node.id,
            "kafka": {"bootstrap_servers": self.bootstrap, "client_id": name},
            "topic_prefix": self.manifest.topic_prefix,
            "http_host": "127.0.0.1",
            "http_port": 0,
            "http_port_file": str(port_file),
        }
        return flatten_env(service, values)

    def _defaults(self, service: Service, env: Mapping[str, str]) -> dict[str, str]:
        """The launcher's choices for a process on this machine, which its environment may override:
        text logs, the consumer timing, and for the model services the machine's compute gate (every
        node's model calls share one, a slot per CPU, or per OMP_NUM_THREADS CPUs, the launcher may
        use: `sapo.cpugate`)."""
        values: dict[str, Any] = {"log_format": "text"}
        profile = self._consumer_profile()
        if profile is not None:
            values["consumer"] = profile.model_dump()
        if service in GATED:
            values["compute_gate_dir"] = str(self.run_dir / "gate")
            values["compute_gate_slots"] = slots_for(usable_cpus(), omp_threads(env))
        return flatten_env(service, values)

    def service_env(
        self, node: NodeSpec, service: Service, name: str, port_file: Path, base: Mapping[str, str]
    ) -> dict[str, str]:
        """One process's environment: `base` (the launcher's own and `env`); the launcher's defaults
        (one OpenMP thread, `_defaults`) for each variable `base` does not set, so that a user's
        `SAPO_TRAINER_COMPUTE_GATE_DIR=` (empty: no gate) or consumer timing wins; then the node's
        wiring and the manifest's values, which nothing else may set."""
        env = dict(base)
        # Many processes share few cores: torch's default thread pool per process oversubscribes them.
        env.setdefault("OMP_NUM_THREADS", "1")
        env |= {k: v for k, v in self._defaults(service, env).items() if k not in env}
        env |= self._wiring(node, service, name, port_file)
        values = service_values(
            node, service, sharing_peers(self.manifest, node), swarm_profiles(self.manifest)
        )
        if service == "trainer":
            values.setdefault("checkpoint_root", str(self.checkpoints))
        env |= flatten_env(service, values)
        env["PYTHONUNBUFFERED"] = "1"
        return with_malloc_tunable(env)  # huge pages for torch's per-step tensors (sapo.malloc)

    def spawn(self, node: NodeSpec, service: Service, replica: int = 0) -> ServiceProcess:
        """Start one service process of a node (a restart of one that died, too)."""
        name = f"{node.id}-{service}" + (f"-{replica}" if replica else "")
        port_file = self.run_dir / "ports" / name
        port_file.unlink(missing_ok=True)
        env = self.service_env(node, service, name, port_file, os.environ | self.env)
        log_path = self.run_dir / "logs" / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{service}.main"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return ServiceProcess(node.id, service, replica, port_file, log_path, proc)

    def failed(self) -> list[ServiceProcess]:
        """Processes that exited with an error while the swarm was meant to be running."""
        return [p for p in self.processes if p.proc.poll() not in (None, 0)]

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        for service in STOP_ORDER:
            group = [p for p in self.processes if p.service == service and p.proc.poll() is None]
            for p in group:
                p.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for p in group:
                try:
                    p.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.proc.kill()
                    p.proc.wait()
        if self.recorder is not None:
            self.recorder.drain()
            self.recorder.close()
        if self.broker is not None:
            self.broker.stop()
