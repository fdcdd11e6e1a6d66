"""Weight hot-reload: verified checkpoints swap in; corrupt, missing or misfit ones are rejected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.backends import TransformersBackend
from sapo.models import build_tiny_model, parse_tiny_ref
from sapo.v1 import policy_pb2
from tests.unit.generator.harness import (
    MemoryGenerator,
    flip_byte,
    memory_generator,
    policy_update,
    settings,
    write_checkpoint,
)

pytestmark = pytest.mark.unit
FAILURES = "sapo_generator_weight_load_failures_total"


def _state(tokenizer: PreTrainedTokenizerBase, ref: str) -> dict[str, torch.Tensor]:
    seed, spec = parse_tiny_ref(ref)
    return build_tiny_model(tokenizer, seed=seed, spec=spec).state_dict()


@pytest.fixture
def gen(tokenizer: PreTrainedTokenizerBase) -> MemoryGenerator:
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer)
    gen = memory_generator(settings(), backend)
    gen.follower.open()
    assert gen.follower.catch_up()
    return gen


def _weights(gen: MemoryGenerator) -> torch.Tensor:
    backend = gen.core.backend
    assert isinstance(backend, TransformersBackend)
    weights: torch.Tensor = backend.model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    return weights.clone()


def _announce(gen: MemoryGenerator, value: bytes) -> None:
    gen.bus.append(gen.topics.policy, b"node-a", value, [])
    gen.follower.poll(0.0)


def test_nothing_announced_means_version_0_and_ready(gen: MemoryGenerator) -> None:
    assert gen.follower.loaded == gen.follower.announced == 0
    assert gen.health.failing() == []
    assert gen.metric("sapo_generator_policy_version") == 0


def test_a_verified_version_is_swapped_in(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    state = _state(tokenizer, "tiny:1")
    _announce(gen, policy_update(write_checkpoint(tmp_path, "node-a", 1, state), "node-a", 1))
    assert gen.follower.loaded == 1
    assert torch.equal(_weights(gen), state["model.layers.0.mlp.up_proj.weight"])
    assert gen.metric("sapo_generator_policy_version") == 1
    assert gen.metric("sapo_generator_weight_load_seconds_count") == 1
    assert gen.health.failing() == []


def test_only_the_newest_of_a_burst_is_loaded(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    for version in (1, 2, 3):
        written = write_checkpoint(tmp_path, "node-a", version, _state(tokenizer, f"tiny:{version}"))
        gen.bus.append(gen.topics.policy, b"node-a", policy_update(written, "node-a", version), [])
    gen.follower.poll(0.0)
    assert gen.follower.loaded == 3
    assert gen.metric("sapo_generator_weight_load_seconds_count") == 1
    # An older announcement (a trainer restarted from an old checkpoint) does not roll weights back.
    written = write_checkpoint(tmp_path, "node-a", 0, _state(tokenizer, "tiny:5"))
    _announce(gen, policy_update(written, "node-a", 0))
    assert gen.follower.loaded == 3


@pytest.mark.parametrize("fault", ["flipped_byte", "wrong_sha256", "missing_shard", "other_shape"])
def test_a_bad_version_is_rejected_and_the_old_weights_stay(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path, fault: str
) -> None:
    before = _weights(gen)
    state = _state(tokenizer, "tiny:1:32x1" if fault == "other_shape" else "tiny:1")
    written = write_checkpoint(tmp_path, "node-a", 1, state)
    sha = "0" * 64 if fault == "wrong_sha256" else None
    if fault == "flipped_byte":
        flip_byte(written)
    if fault == "missing_shard":
        next(written.directory.glob("*.safetensors")).unlink()
    _announce(gen, policy_update(written, "node-a", 1, sha256=sha))

    reason = {"missing_shard": "missing", "other_shape": "incompatible"}.get(fault, "digest_mismatch")
    assert gen.metric(FAILURES, {"reason": reason}) == 1
    assert gen.follower.loaded == 0 and gen.follower.announced == 1
    assert torch.equal(_weights(gen), before)
    assert gen.metric("sapo_generator_policy_version") == 0
    assert gen.health.failing() == ["weights_ok"]

    good = write_checkpoint(tmp_path / "good", "node-a", 2, _state(tokenizer, "tiny:2"))
    _announce(gen, policy_update(good, "node-a", 2))
    assert gen.follower.loaded == 2
    assert gen.health.failing() == []


def test_invalid_or_foreign_updates_are_dead_lettered(gen: MemoryGenerator, tmp_path: Path) -> None:
    incomplete = policy_pb2.PolicyUpdate(schema_version=1, node_id="node-a", version=4).SerializeToString()
    written = write_checkpoint(tmp_path, "node-b", 4, {"w": torch.zeros(2)})
    _announce(gen, incomplete)
    _announce(gen, policy_update(written, "node-b", 4))
    _announce(gen, b"\xff\xff")
    dead = [r.headers["sapo-dlq-reason"] for r in gen.bus.topics[gen.topics.dlq]]
    assert dead == [b"incomplete_policy_update", b"foreign_node", b"undecodable"]
    assert gen.follower.loaded == gen.follower.announced == 0
    assert gen.health.failing() == []
