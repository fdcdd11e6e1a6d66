"""Checkpoint publish -> generator serving the new weights, bundled 135M model, `file://` and `s3://`.

Generators run their real wiring (runtime, policy follower, work consumer; embedded broker) in threads
of this process, waiting on their work topic as lock-step replicas do while their trainer steps; the
node's work topic has one partition per replica.
For each version: write it with `CheckpointStore.publish` (timed: the trainer's cost), start the clock,
announce the PolicyUpdate (acknowledged) and plan that round's work (`WorkPlanner`: one item per replica,
flushed), in the trainer's order; stop the clock when the backend reports the new version (first
replica, and every replica). The round's groups (2 completions of 1 token) are sampled before the
baselines are timed, so nothing else runs while they are.
The store is a local directory (`file://`) or a bucket of moto's S3 server on 127.0.0.1 (`s3://`,
explicit credentials through AWS_* variables).

Why the work: an idle generator blocks on its work topic, not the policy topic (`sapo.node.generator`:
in lock-step the trainer announces a version, then plans the round that needs it), so a version that no
work follows is loaded at the generator's next wake-up (up to 0.5 s), when nothing waits on it: without
the work this bench would time that wake-up rather than the load.

Baselines in the same run, page cache warm: a bare `safetensors.torch.load_file` of the same weights
from one local file + `load_state_dict` into a copy of the model (the target: publish -> swapped within
1.5x of it), and for `s3://` also a bare download of the version's shard objects + `load` +
`load_state_dict` from the same store, the same target: over moto on loopback the download alone
takes ~18x a local load, so only the second comparison says what the store code adds.

    .venv/bin/python bench/bench_reload.py [--repeats 5] [--stores file,s3] [--replicas 2]

What it read, with and without the work: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.s3: moto's server for s3://

import torch
from safetensors.torch import load, load_file, save_file

from sapo import storage
from sapo.backends import TransformersBackend
from sapo.broker import EmbeddedBroker
from sapo.checkpoints import CheckpointStore, Written
from sapo.generator.settings import GeneratorSettings
from sapo.generator.work import Pacing, PacingMode
from sapo.kafka import KafkaPublisher
from sapo.models import BUNDLED_REF
from sapo.node.generator import GeneratorService
from sapo.node.planner import WorkPlanner
from sapo.runtime import Runtime, start_runtime
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.tensorfile import dedupe
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import policy_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp
from tests.s3 import moto_server

TARGET = 1.5


def wait(value: Callable[[], int], target: int, what: str, timeout_s: float = 300.0) -> None:
    """Spin (1 ms) until `value()` reaches `target`."""
    deadline = time.monotonic() + timeout_s
    while value() < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s} s")
        time.sleep(0.001)


def update(written: Written, version: int) -> bytes:
    return policy_pb2.PolicyUpdate(
        schema_version=SCHEMA_VERSION,
        node_id=written.manifest.node_id,
        version=version,
        manifest_uri=written.manifest_uri,
        manifest_sha256=written.manifest_sha256,
        created_at=now_timestamp(),
    ).SerializeToString()


def summary(values: Sequence[float]) -> str:
    return f"{statistics.median(values):6.3f} s  [{min(values):.3f} - {max(values):.3f}]"


@dataclass
class Timings:
    write: list[float] = field(default_factory=list)  # CheckpointStore.publish of the weights
    first: list[float] = field(default_factory=list)  # announce -> the first replica swapped
    every: list[float] = field(default_factory=list)  # announce -> every replica swapped
    load: list[float] = field(default_factory=list)  # the first replica's own load path (its metric)
    bare: list[float] = field(default_factory=list)  # load_file + load_state_dict, local file
    bare_store: list[float] = field(default_factory=list)  # download the shards + load + load_state_dict
    mb: float = 0.0


@contextmanager
def generators(bootstrap: str, node: str, replicas: int) -> Iterator[list[tuple[Runtime, GeneratorService]]]:
    """`replicas` generator wirings of `node`, each running in a thread, stopped on exit."""
    specs = TopicNames.for_node(node).specs(work_partitions=replicas)
    ensure_topics({"bootstrap.servers": bootstrap}, specs, timeout_s=30)
    settings = GeneratorSettings(
        node_id=node,
        kafka=KafkaConnection(bootstrap_servers=bootstrap),
        consumer=ConsumerProfile.local(),
        http_host="127.0.0.1",
        http_port=0,
        log_format="text",
        log_level="WARNING",
        model=BUNDLED_REF,
        completions_per_question=2,
        max_new_tokens=1,
        policy_catchup_idle_s=1.0,
    )
    running = []
    for _ in range(replicas):
        runtime = start_runtime("generator", settings, install_signals=False)
        core = GeneratorService.prepare(settings)(runtime)
        thread = threading.Thread(target=core.run, name="generator", daemon=True)
        thread.start()
        running.append((runtime, core, thread))
    try:
        yield [(runtime, core) for runtime, core, _ in running]
    finally:
        for runtime, _, thread in running:
            runtime.stop.set("bench over")
            thread.join(timeout=60)
            runtime.close()


def bare_local(model: torch.nn.Module, file: Path) -> float:
    started = time.perf_counter()
    model.load_state_dict(load_file(str(file)), strict=False)
    return time.perf_counter() - started


def bare_store(model: torch.nn.Module, written: Written) -> float:
    started = time.perf_counter()
    state: dict[str, torch.Tensor] = {}
    for entry in written.manifest.weights:
        state.update(load(storage.read_bytes(written.directory / entry.name, max_bytes=entry.bytes)))
    model.load_state_dict(state, strict=False)
    return time.perf_counter() - started


@dataclass(frozen=True)
class Baseline:
    """The weights every version carries, one local file of them, and a model to bare-load them into."""

    state: dict[str, torch.Tensor]
    file: Path
    model: torch.nn.Module


def load_seconds(runtime: Runtime) -> float:
    return runtime.registry.get_sample_value("sapo_generator_weight_load_seconds_sum") or 0.0


def wait_idle(running: Sequence[tuple[Runtime, GeneratorService]]) -> None:
    """Every replica has caught up with the policy topic and owns a partition of the work topic."""
    for _, core in running:
        wait(lambda core=core: int(core.work.opened), 1, "the generator's start")  # type: ignore[misc]
    for _, core in running:
        wait(lambda core=core: len(core.work.assigned), 1, "a work partition")  # type: ignore[misc]


def measure(bootstrap: str, url: str, replicas: int, repeats: int, base: Baseline) -> Timings:
    """Publish `repeats` versions to the store at `url` and time how replicas pick them up (a node of
    its own per run: a fresh policy topic)."""
    timings = Timings()
    store = CheckpointStore(url, keep_last=2)
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap})
    node = f"bench-{url.split(':', maxsplit=1)[0]}-{replicas}"
    with generators(bootstrap, node, replicas) as running:
        topics = running[0][0].topics
        lockstep = Pacing(PacingMode.LOCKSTEP, max_ahead=0, rounds=0)
        planner = WorkPlanner(
            publisher, topics.work, node, per_round=replicas, pacing=lockstep, flush_timeout_s=30
        )
        backends = [core.backend for _, core in running]
        wait_idle(running)
        for version in range(1, repeats + 1):
            started = time.perf_counter()
            written = store.publish(node, version, base.state, base_model=BUNDLED_REF).written
            assert written is not None
            timings.write.append(time.perf_counter() - started)
            loaded_before = load_seconds(running[0][0])
            started = time.perf_counter()
            publisher.send_sync(topics.policy, node.encode(), update(written, version))
            planner.plan(version)
            wait(lambda: max(b.model_version for b in backends), version, f"a load of v{version}")
            timings.first.append(time.perf_counter() - started)
            wait(lambda: min(b.model_version for b in backends), version, f"every load of v{version}")
            timings.every.append(time.perf_counter() - started)
            timings.load.append(load_seconds(running[0][0]) - loaded_before)
            wait(
                lambda: sum(core.generated for _, core in running),
                replicas * version,
                f"round {version}'s groups",
            )
            timings.bare.append(bare_local(base.model, base.file))
            if not written.directory.local:
                timings.bare_store.append(bare_store(base.model, written))
            timings.mb = sum(e.bytes for e in written.manifest.weights) / 1e6
    return timings


def report(name: str, replicas: int, t: Timings) -> bool:
    print(f"\n{name}, {replicas} replica(s), {len(t.write)} versions of {t.mb:.0f} MB")
    print(f"  write the version (CheckpointStore.publish)  {summary(t.write)}")
    print(f"  announce -> first replica swapped          {summary(t.first)}")
    if replicas > 1:
        print(f"  announce -> all {replicas} replicas swapped         {summary(t.every)}")
    print(f"  replica 1's load path (verify + swap)      {summary(t.load)}")
    print(f"  bare load_file + load_state_dict (local)   {summary(t.bare)}")
    ratio = statistics.median(t.first) / statistics.median(t.bare)
    if t.bare_store:
        print(f"  bare download + load + load_state_dict     {summary(t.bare_store)}")
        store_ratio = statistics.median(t.first) / statistics.median(t.bare_store)
        store_outcome = "PASS" if store_ratio <= TARGET else "FAIL"
        print(f"  ratio swapped / bare download              {store_ratio:6.2f}x  ", end="")
        print(f"target <= {TARGET}x: {store_outcome}")
    verdict = ratio <= TARGET
    outcome = "PASS" if verdict else "FAIL"
    print(f"  ratio swapped / bare local load            {ratio:6.2f}x  target <= {TARGET}x: {outcome}")
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=5, help="versions per run (default: %(default)s)")
    parser.add_argument("--stores", default="file,s3", help="stores to measure (default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=2, help="replicas, second run (default: %(default)s)")
    args = parser.parse_args()
    stores = args.stores.split(",")
    results = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sapo-bench-")))
        broker = stack.enter_context(EmbeddedBroker())
        backend = TransformersBackend.from_model_ref(BUNDLED_REF, dtype=torch.float32)
        model = copy.deepcopy(backend.model)
        base = Baseline(model.state_dict(), tmp / "bare.safetensors", model)  # tied: lm_head = embedding
        del backend
        save_file(dedupe(base.state)[0], str(base.file))
        urls = {}
        if "file" in stores:
            urls["file"] = (tmp / "store").as_uri()
        if "s3" in stores:
            server = stack.enter_context(moto_server())
            os.environ.update(server.env)
            urls["s3"] = f"s3://{server.create_bucket('bench')}/checkpoints"
        for name, url in urls.items():
            for replicas in sorted({1, args.replicas}):
                timings = measure(broker.bootstrap, url, replicas, args.repeats, base)
                results.append(report(name, replicas, timings))
                storage.remove_tree(storage.location(url))
                gc.collect()  # close the clients (held in reference cycles) before the broker stops
    print(f"\n{sum(results)} of {len(results)} runs within {TARGET}x of a bare local load")
    return 0


if __name__ == "__main__":
    logging.getLogger("sapo.librdkafka").setLevel(logging.CRITICAL)
    raise SystemExit(main())
