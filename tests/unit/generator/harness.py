"""Test doubles for the generator: a scripted backend, an in-memory core, and policy announcements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from transformers import PreTrainedTokenizerBase

from sapo import storage
from sapo.backends import GenerationBackend, Sample, SamplingConfig, WeightsSource
from sapo.checkpoints import CheckpointStore, Written
from sapo.generator import ReloadPolicy
from sapo.generator.settings import GeneratorSettings
from sapo.generator.work import PacingMode, PacingSettings
from sapo.kafka import DeadLetters, Publisher, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag
from sapo.node.build import model_shapes
from sapo.node.generator import GeneratorService
from sapo.node.metrics import GeneratorMetrics
from sapo.node.planner import WorkPlanner
from sapo.node.policy import PolicyFollower
from sapo.ops import Health
from sapo.storage import Location
from sapo.topics import TopicNames
from sapo.v1 import policy_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp

Script = Callable[[Sequence[int], int], Sample]


def wrong_answer(prompt: Sequence[int], index: int) -> Sample:
    return Sample(
        text="nope</answer>", token_ids=(7, 8, 9), logprobs=(-1.0, -2.0, -3.0), finish_reason="stop"
    )


class ScriptedBackend:
    """A GenerationBackend whose completions come from `script(prompt_ids, sample_index)`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, script: Script = wrong_answer) -> None:
        self._tokenizer = tokenizer
        self._version = 0
        self.script = script
        self.calls: list[tuple[list[tuple[int, ...]], SamplingConfig, int]] = []

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def model_version(self) -> int:
        return self._version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> list[list[Sample]]:
        self.calls.append(([tuple(p) for p in prompts], params, self._version))
        return [[self.script(p, j) for j in range(params.num_samples)] for p in prompts]

    def load_weights(self, weights: WeightsSource, version: int, *, owned: bool = False) -> None:
        self._version = version


def settings(**overrides: Any) -> GeneratorSettings:
    """Small, fast generator settings for node-a (override any field)."""
    values: dict[str, Any] = {
        "node_id": "node-a",
        "model": "tiny:0",
        "node_seed": 11,
        "completions_per_question": 3,
        "max_new_tokens": 4,
        "policy_catchup_idle_s": 0.05,
    }
    return GeneratorSettings(**(values | overrides))


@dataclass
class MemoryGenerator:
    """A GeneratorService over the in-memory transport, with everything a test inspects."""

    core: GeneratorService
    follower: PolicyFollower
    bus: MemoryBus
    topics: TopicNames
    registry: CollectorRegistry
    health: Health
    stop: StopFlag

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, dict(labels or {}))


def memory_generator(
    config: GeneratorSettings,
    backend: GenerationBackend,
    bus: MemoryBus | None = None,
    reload: ReloadPolicy | None = None,
) -> MemoryGenerator:
    bus = bus or MemoryBus()
    registry = CollectorRegistry()
    topics = TopicNames.for_node(config.node_id)
    metrics = GeneratorMetrics(registry, [spec.name for spec in config.task_profile()])
    transport = TransportMetrics(registry, "generator")
    health, stop = Health(), StopFlag()
    publisher: Publisher = MemoryPublisher(bus)
    follower = PolicyFollower(
        MemoryConsumerClient(bus, "generator-policy"),
        topic=topics.policy,
        node_id=config.node_id,
        backend=backend,
        metrics=metrics,
        transport=transport,
        health=health,
        stop=stop,
        max_payload_bytes=config.max_payload_bytes,
        catchup_idle_s=config.policy_catchup_idle_s,
        reload=reload or config.reload_policy(),
        dead_letters=DeadLetters(publisher, topics.dlq, "generator", transport),
        shapes=model_shapes(backend),
        poll_timeout_s=0.0,
    )
    core = GeneratorService(
        config,
        backend,
        follower,
        work_client=MemoryConsumerClient(bus, "generator"),
        publisher=publisher,
        swarm_publisher=publisher,
        topics=topics,
        metrics=metrics,
        transport=transport,
        health=health,
        stop=stop,
        dead_letters=DeadLetters(publisher, topics.dlq, "generator", transport),
        signer=config.identity.signer(),
    )
    return MemoryGenerator(core, follower, bus, topics, registry, health, stop)


def plan(
    gen: MemoryGenerator, version: int, per_round: int = 2, mode: str = "lockstep", **pacing: int
) -> None:
    """Publish the work the node's trainer would once `version` exists (a fresh planner each call:
    rounds from `version` on, as a trainer starting at that version plans them)."""
    settings = PacingSettings(round_mode=PacingMode(mode), **pacing)
    publisher = MemoryPublisher(gen.bus)
    planner = WorkPlanner(
        publisher, gen.topics.work, "node-a", per_round=per_round, pacing=settings.pacing(), flush_timeout_s=1
    )
    planner.plan(version)


def policy_update(
    written: Written, node_id: str, version: int, sha256: str | None = None, epoch: int = 0
) -> bytes:
    """The serialized PolicyUpdate a trainer would announce for `written` (optionally a wrong digest)."""
    return policy_pb2.PolicyUpdate(
        schema_version=SCHEMA_VERSION,
        node_id=node_id,
        version=version,
        manifest_uri=written.manifest_uri,
        manifest_sha256=sha256 or written.manifest_sha256,
        created_at=now_timestamp(),
        epoch=epoch,
    ).SerializeToString()


def write_checkpoint(
    root: Path | str,
    node_id: str,
    version: int,
    state: Mapping[str, torch.Tensor],
    base_model: str = "tiny:1",
) -> Written:
    """Publish `state` as `version` in the store at `root` (a path or URL)."""
    written = (
        CheckpointStore(root, keep_last=10).publish(node_id, version, state, base_model=base_model).written
    )
    assert written is not None
    return written


def shard_of(written: Written) -> Location:
    """The first weight file of a version."""
    return written.directory / written.manifest.weights[0].name


def flip_byte(written: Written) -> None:
    """Corrupt the first weight shard after its digest was recorded (bit rot, a torn copy)."""
    shard = shard_of(written)
    data = bytearray(storage.read_bytes(shard))
    data[len(data) // 2] ^= 0xFF
    with shard.fs.open(shard.path, "wb") as out:
        out.write(bytes(data))
