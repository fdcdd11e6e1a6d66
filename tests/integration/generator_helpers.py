"""Helpers for generator integration tests: the real wiring in a thread, a group collector, announcements."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry

from sapo import wire
from sapo.generator.settings import GeneratorSettings
from sapo.generator.work import PacingSettings
from sapo.kafka import ConsumerLoop, Disposition, KafkaPublisher, Record, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.node.generator import REFUSALS, GeneratorService
from sapo.node.planner import WorkPlanner
from sapo.runtime import Runtime, start_runtime
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import rollout_pb2
from tests.integration.kafka_helpers import consumer

ROOT = Path(__file__).resolve().parents[2]


def launch_generator(
    bootstrap: str, prefix: str, log: Path, settings: dict[str, str], env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m services.generator.main` on the test broker, configured through `SAPO_GENERATOR_*`
    (tiny model, fast consumer timing, text logs to `log`, ops server on a free port) plus `settings`."""
    values = {
        "TOPIC_PREFIX": prefix,
        "KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "CONSUMER__SESSION_TIMEOUT_MS": "6000",
        "CONSUMER__HEARTBEAT_INTERVAL_MS": "1000",
        "CONSUMER__FETCH_WAIT_MAX_MS": "50",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": "0",
        "LOG_FORMAT": "text",
        "MODEL": "tiny:0",
        "POLICY_CATCHUP_IDLE_S": "1",
    } | settings
    base = {k: v for k, v in (env or os.environ).items() if not k.startswith("SAPO_GENERATOR_")}
    base |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    base |= {f"SAPO_GENERATOR_{name}": value for name, value in values.items()}
    cmd = [sys.executable, "-m", "services.generator.main"]
    with log.open("wb") as sink:  # a file, not a pipe nobody drains while the test waits
        return subprocess.Popen(cmd, cwd=ROOT, env=base, stdout=sink, stderr=subprocess.STDOUT)


def generator_settings(
    bootstrap: str, prefix: str, node_id: str = "node-a", **overrides: Any
) -> GeneratorSettings:
    """Fast settings against the test broker: tiny model, one question of two completions per round."""
    values: dict[str, Any] = {
        "node_id": node_id,
        "topic_prefix": prefix,
        "kafka": KafkaConnection(bootstrap_servers=bootstrap),
        "consumer": ConsumerProfile.local(),
        "http_host": "127.0.0.1",
        "http_port": 0,
        "log_format": "text",
        "model": "tiny:0",
        "node_seed": 21,
        "completions_per_question": 2,
        "max_new_tokens": 6,
        "policy_catchup_idle_s": 1.0,
    }
    return GeneratorSettings(**(values | overrides))


def plan_work(
    bootstrap: str, prefix: str, node_id: str, version: int, per_round: int = 1, **pacing: Any
) -> None:
    """Publish the work items a node's trainer publishes once `version` exists (planned from `version`
    on, as a trainer starting there would)."""
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap})
    topic = TopicNames.for_node(node_id, prefix).work
    plan = PacingSettings(**pacing).pacing()
    WorkPlanner(publisher, topic, node_id, per_round=per_round, pacing=plan, flush_timeout_s=30).plan(version)


def create_node_topics(bootstrap: str, prefix: str, *node_ids: str) -> None:
    specs = [spec for node in node_ids for spec in TopicNames.for_node(node, prefix).specs()]
    ensure_topics({"bootstrap.servers": bootstrap}, specs, timeout_s=30)


class ThreadedGenerator:
    """`GeneratorService.from_runtime` on a real Runtime (ops server, no signal handlers, the generator's
    refusals at 0 as `sapo-generator` shows them), in a thread."""

    def __init__(self, settings: GeneratorSettings) -> None:
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        self.runtime: Runtime = start_runtime("generator", settings, refusals=REFUSALS, install_signals=False)
        root.handlers[:], root.level = handlers, level  # keep pytest's log capture
        self.core = GeneratorService.prepare(settings)(self.runtime)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="generator", daemon=True)

    def _run(self) -> None:
        try:
            self.core.run()
        except BaseException as exc:  # surfaced to the test by stop()
            self.error = exc
            raise

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.runtime.stop.set("test over")
        self._thread.join(timeout=60)
        self.runtime.close()
        assert not self._thread.is_alive(), "the generator did not stop within 60 s"
        assert self.error is None, f"the generator thread failed: {self.error!r}"
        # The producers sit in reference cycles (consumer loop <-> its handler); collect them now, while
        # the broker still runs, rather than at some later GC that would log connection errors.
        del self.core, self.runtime
        gc.collect()

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.runtime.registry.get_sample_value(name, labels or {})

    def readyz(self) -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{self.runtime.ops.port}/readyz")


def http_get(url: str) -> tuple[int, str]:
    """Status and body of a GET (an ops endpoint), errors included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class GroupCollector:
    """Reads RolloutGroups from some topics as the test asks for them (one group join for the whole test)."""

    def __init__(self, bootstrap: str, group: str, *topics: str) -> None:
        self.records: list[Record] = []
        self.groups: list[rollout_pb2.RolloutGroup] = []
        self._loop = ConsumerLoop(
            consumer(bootstrap, group),
            list(topics),
            self._handle,
            stop=StopFlag(),
            metrics=TransportMetrics(CollectorRegistry(), "collector"),
            poll_timeout_s=0.2,
        )
        self._loop.open()

    def _handle(self, record: Record) -> Disposition:
        self.records.append(record)
        self.groups.append(wire.decode(rollout_pb2.RolloutGroup, record.value, 1 << 22))
        return Disposition.DONE

    def wait_for(self, count: int, timeout_s: float = 40.0) -> list[rollout_pb2.RolloutGroup]:
        """The first `count` groups read; fails if they do not arrive in time."""
        deadline = time.monotonic() + timeout_s
        while len(self.groups) < count:
            assert time.monotonic() < deadline, f"only {len(self.groups)} of {count} groups in {timeout_s} s"
            self._loop.step()
        return self.groups[:count]

    def on(self, topic: str) -> list[rollout_pb2.RolloutGroup]:
        """The groups read so far from `topic`."""
        return [g for r, g in zip(self.records, self.groups, strict=True) if r.topic == topic]

    def close(self) -> None:
        self._loop.close()


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.1)


def announce(bootstrap: str, topic: str, node_id: str, value: bytes) -> None:
    """Publish a PolicyUpdate the way the trainer does: keyed by node id, acknowledged."""
    KafkaPublisher({"bootstrap.servers": bootstrap}).send_sync(topic, node_id.encode(), value)
