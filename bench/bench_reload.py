"""Checkpoint-publish -> generator-loaded latency for the bundled 135M model, against a bare reload.

The generator runs its real wiring (runtime, policy follower, core; embedded broker) in lock-step with
one question, two completions and one new token per round, so after each round it sits waiting for the
next policy version, as a lock-step node does while its trainer steps. For each version: write a
checkpoint of the model with `CheckpointStore`, start the clock, publish the PolicyUpdate (acknowledged),
stop the clock when the backend reports the new version. Same-run baseline on the same checkpoint files,
page cache warm for both: a bare `load_file` + `load_state_dict` into a copy of the model. The gap is
Kafka delivery and polling, the sha256 checks of manifest and shards, and the key / shape checks.

    .venv/bin/python bench/bench_reload.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from safetensors.torch import load_file

from sapo.backends import TransformersBackend
from sapo.broker import EmbeddedBroker
from sapo.checkpoints import CheckpointStore, Written, sha256_file
from sapo.generator.settings import GeneratorSettings
from sapo.kafka import KafkaPublisher
from sapo.models import BUNDLED_REF
from sapo.node.generator import GeneratorService
from sapo.runtime import start_runtime
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import policy_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp

NODE = "bench"


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
        node_id=NODE,
        version=version,
        manifest_uri=written.manifest_uri,
        manifest_sha256=written.manifest_sha256,
        created_at=now_timestamp(),
    ).SerializeToString()


def summary(values: Sequence[float]) -> str:
    return f"{statistics.median(values):6.3f} s  [{min(values):.3f} - {max(values):.3f}]"


@dataclass
class Timings:
    model_load: float = 0.0
    checkpoint_mb: float = 0.0
    latency: list[float] = field(default_factory=list)  # publish -> backend reports the version
    load_path: list[float] = field(default_factory=list)  # the follower's own measurement (metric)
    verify: list[float] = field(default_factory=list)  # sha256 of the shards alone
    bare: list[float] = field(default_factory=list)  # load_file + load_state_dict


def bare_reload(model: torch.nn.Module, shards: Sequence[Path]) -> float:
    started = time.perf_counter()
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        loaded.update(load_file(str(shard)))
    model.load_state_dict(loaded, strict=False)
    return time.perf_counter() - started


def hash_time(shards: Sequence[Path]) -> float:
    started = time.perf_counter()
    for shard in shards:
        sha256_file(shard)
    return time.perf_counter() - started


def measure(bootstrap: str, root: Path, repeats: int) -> Timings:
    """Run the generator against `bootstrap` and time `repeats` published versions."""
    settings = GeneratorSettings(
        node_id=NODE,
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
    timings = Timings()
    runtime = start_runtime("generator", settings, install_signals=False)
    started = time.perf_counter()
    core = GeneratorService.from_runtime(settings, runtime)
    timings.model_load = time.perf_counter() - started
    backend = core.backend
    assert isinstance(backend, TransformersBackend)
    state = {name: t.detach().clone() for name, t in backend.model.state_dict().items()}
    bare_model = copy.deepcopy(backend.model)
    store = CheckpointStore(root, keep_last=2)
    publisher = KafkaPublisher({"bootstrap.servers": bootstrap})
    load_sum = "sapo_generator_weight_load_seconds_sum"
    thread = threading.Thread(target=core.run, name="generator", daemon=True)
    thread.start()
    try:
        # No work is planned: the generator idles on its policy follower, the state reloads start from.
        wait(lambda: int(bool(core.work.assigned)), 1, "the work topic's assignment")
        for version in range(1, repeats + 1):
            written = store.write(NODE, version, state, base_model=BUNDLED_REF)
            loaded_before = runtime.registry.get_sample_value(load_sum) or 0.0
            started = time.perf_counter()
            publisher.send_sync(runtime.topics.policy, NODE.encode(), update(written, version))
            wait(lambda: backend.model_version, version, f"load of v{version}")
            timings.latency.append(time.perf_counter() - started)
            timings.load_path.append((runtime.registry.get_sample_value(load_sum) or 0.0) - loaded_before)
            shards = sorted(written.directory.glob("*.safetensors"))
            timings.checkpoint_mb = sum(f.stat().st_size for f in shards) / 1e6
            timings.bare.append(bare_reload(bare_model, shards))
            timings.verify.append(hash_time(shards))
    finally:
        runtime.stop.set("bench over")
        thread.join(timeout=60)
        runtime.close()
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=5, help="versions published (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sapo-bench-") as tmp, EmbeddedBroker() as broker:
        ensure_topics(
            {"bootstrap.servers": broker.bootstrap}, TopicNames.for_node(NODE).specs(), timeout_s=30
        )
        t = measure(broker.bootstrap, Path(tmp), args.repeats)
        gc.collect()  # close the clients (held in reference cycles) before the broker stops
    print(f"model {BUNDLED_REF} (float32), checkpoint {t.checkpoint_mb:.0f} MB, {args.repeats} versions")
    print(f"model load at start (from_runtime)          {t.model_load:6.1f} s")
    print(f"publish -> weights swapped (median [range]) {summary(t.latency)}")
    print(f"  the follower's load path (metric)         {summary(t.load_path)}")
    print(f"  sha256 of the shards alone                {summary(t.verify)}")
    print(f"bare load_file + load_state_dict            {summary(t.bare)}")
    ratio = statistics.median(t.latency) / statistics.median(t.bare)
    print(f"ratio publish->swapped / bare               {ratio:6.2f}x")
    return 0


if __name__ == "__main__":
    logging.getLogger("sapo.librdkafka").setLevel(logging.CRITICAL)
    raise SystemExit(main())
