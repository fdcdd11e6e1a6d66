"""Weight hot-reload: verified checkpoints swap in; corrupt or misfit ones are rejected; ones not visible
yet are retried with backoff (lower versions loading meanwhile), given up after a bound, and a generator
whose announced versions stay unresolved stops being live; a slow load does not hold the loop."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch
from fsspec.registry import known_implementations
from transformers import PreTrainedTokenizerBase

from sapo import storage
from sapo.backends import TransformersBackend
from sapo.generator import ReloadPolicy
from sapo.models import build_tiny_model, parse_tiny_ref
from sapo.node import policy
from sapo.v1 import policy_pb2
from tests.s3 import slow_link
from tests.unit.generator.harness import (
    MemoryGenerator,
    flip_byte,
    memory_generator,
    policy_update,
    settings,
    shard_of,
    write_checkpoint,
)

pytestmark = pytest.mark.unit
FAILURES = "sapo_generator_weight_load_failures_total"
RETRIES = "sapo_generator_weight_load_retries_total"
REJECTED = "sapo_generator_messages_rejected_total"
FAST = ReloadPolicy(initial_s=0.02, max_s=0.05, give_up_s=0.3, max_behind_s=0.6)


def _state(tokenizer: PreTrainedTokenizerBase, ref: str) -> dict[str, torch.Tensor]:
    seed, spec = parse_tiny_ref(ref)
    return build_tiny_model(tokenizer, seed=seed, spec=spec).state_dict()


@pytest.fixture(autouse=True)
def _loads_finish_within_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read a load's outcome right after the poll that started it, as a generator does
    with a load that finishes within the hold: a loaded machine must not make a tiny model's load
    outlast it. The tests of a load that outlasts it set a short hold of their own."""
    monkeypatch.setattr(policy, "LOAD_HOLD_S", 60.0)


@pytest.fixture
def gen(tokenizer: PreTrainedTokenizerBase) -> MemoryGenerator:
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer)
    gen = memory_generator(settings(), backend, reload=FAST)
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
    written = write_checkpoint(tmp_path / "old", "node-a", 0, _state(tokenizer, "tiny:5"))
    _announce(gen, policy_update(written, "node-a", 0))
    assert gen.follower.loaded == 3


@pytest.mark.parametrize("fault", ["flipped_byte", "wrong_sha256", "other_shape"])
def test_a_bad_version_is_rejected_and_the_old_weights_stay(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path, fault: str
) -> None:
    before = _weights(gen)
    state = _state(tokenizer, "tiny:1:32x1" if fault == "other_shape" else "tiny:1")
    written = write_checkpoint(tmp_path, "node-a", 1, state)
    sha = "0" * 64 if fault == "wrong_sha256" else None
    if fault == "flipped_byte":
        flip_byte(written)
    _announce(gen, policy_update(written, "node-a", 1, sha256=sha))

    reason = "incompatible" if fault == "other_shape" else "digest_mismatch"
    assert gen.metric(FAILURES, {"reason": reason}) == 1
    assert gen.metric(RETRIES, {"reason": "missing"}) == 0  # permanent: not retried
    assert gen.follower.loaded == 0 and gen.follower.announced == 1
    assert torch.equal(_weights(gen), before)
    assert gen.metric("sapo_generator_policy_version") == 0
    assert gen.health.failing() == []  # rejected, counted: the same bytes would fail after a restart too
    assert gen.health.alive()

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


def test_a_restart_dead_letters_only_what_arrives_after_it(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """The compacted topic is read again on every start: what an earlier start dead-lettered is counted,
    not dead-lettered again; an update refused after the start still is, once."""
    gen.bus.append(gen.topics.policy, b"node-a", b"\xff\xff", [])  # arrived while no generator read
    _announce(gen, b"\xfe")
    written = write_checkpoint(tmp_path, "node-a", 1, _state(tokenizer, "tiny:1"))
    _announce(gen, policy_update(written, "node-a", 1))
    assert len(gen.bus.topics[gen.topics.dlq]) == 2 and gen.follower.loaded == 1

    restarted = memory_generator(
        settings(), TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer), gen.bus, FAST
    )
    restarted.follower.open()
    assert restarted.follower.catch_up()
    assert restarted.follower.loaded == 1
    assert restarted.metric(REJECTED, {"reason": "undecodable"}) == 2
    assert len(gen.bus.topics[gen.topics.dlq]) == 2
    _announce(restarted, policy_pb2.PolicyUpdate(schema_version=1, node_id="node-a").SerializeToString())
    dead = [r.headers["sapo-dlq-reason"] for r in gen.bus.topics[gen.topics.dlq]]
    assert dead == [b"undecodable", b"undecodable", b"incomplete_policy_update"]
    assert restarted.metric(REJECTED, {"reason": "incomplete_policy_update"}) == 1


def test_a_first_start_counts_but_does_not_dead_letter_what_the_topic_already_holds(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Whether an earlier start dead-lettered a record cannot be told: none that was on the topic before
    this start is, a first start's included (it stays on the policy topic, and is counted)."""
    gen = memory_generator(settings(), TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer))
    gen.bus.append(gen.topics.policy, b"node-b", b"\xff", [])
    gen.follower.open()
    assert gen.follower.catch_up()
    assert gen.metric(REJECTED, {"reason": "undecodable"}) == 1
    assert gen.topics.dlq not in gen.bus.topics and gen.health.failing() == []


def _poll_until(gen: MemoryGenerator, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
        gen.follower.poll(0.0)


def test_a_shard_not_visible_yet_is_retried_with_backoff_and_then_loaded(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    state = _state(tokenizer, "tiny:1")
    written = write_checkpoint(tmp_path, "node-a", 1, state)
    shard = shard_of(written)
    data = storage.read_bytes(shard)
    shard.fs.rm_file(shard.path)  # announced before the shard is visible (NFS attribute cache, S3 replica)
    _announce(gen, policy_update(written, "node-a", 1))
    assert gen.metric(RETRIES, {"reason": "missing"}) == 1
    assert gen.follower.loaded == 0 and gen.health.failing() == ["weights_ok"]  # behind: not ready
    assert gen.health.alive()

    shard.fs.pipe_file(shard.path, data)
    _poll_until(gen, lambda: gen.follower.loaded == 1)
    assert torch.equal(_weights(gen), state["model.layers.0.mlp.up_proj.weight"])
    assert gen.metric(FAILURES, {"reason": "missing"}) == 0
    assert gen.health.failing() == [] and gen.health.alive()


def test_a_version_that_stays_missing_is_given_up_once(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    written = write_checkpoint(tmp_path, "node-a", 1, _state(tokenizer, "tiny:1"))
    manifest = written.directory / "manifest.json"
    manifest.fs.rm_file(manifest.path)
    _announce(gen, policy_update(written, "node-a", 1))
    assert gen.health.failing() == ["weights_ok"]  # retrying: not ready
    _poll_until(gen, lambda: gen.metric(FAILURES, {"reason": "missing"}) == 1)
    retries = gen.metric(RETRIES, {"reason": "missing"})
    assert retries is not None and 2 <= retries < 30  # backoff: doubling waits, bounded in time
    assert gen.health.failing() == []  # given up: nothing left to wait for
    time.sleep(FAST.max_behind_s)
    gen.follower.poll(0.0)
    assert gen.metric(RETRIES, {"reason": "missing"}) == retries  # given up: no retry storm
    assert gen.health.alive() and gen.follower.loaded == 0

    good = write_checkpoint(tmp_path / "good", "node-a", 2, _state(tokenizer, "tiny:2"))
    _announce(gen, policy_update(good, "node-a", 2))
    assert gen.follower.loaded == 2
    assert gen.health.failing() == [] and gen.health.alive()


def test_a_generator_whose_newer_versions_stay_unloadable_is_not_live(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    patient = ReloadPolicy(initial_s=0.02, max_s=0.05, give_up_s=60.0, max_behind_s=0.3)
    gen = memory_generator(
        settings(), TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer), reload=patient
    )
    gen.follower.open()
    assert gen.follower.catch_up()
    written = write_checkpoint(tmp_path, "node-a", 1, _state(tokenizer, "tiny:1"))
    shard = shard_of(written)
    shard.fs.rm_file(shard.path)  # the checkpoint store is lost to this process
    _announce(gen, policy_update(written, "node-a", 1))
    assert gen.health.alive()
    _poll_until(gen, lambda: not gen.health.alive())
    assert gen.health.failing() == ["weights_ok"] and gen.follower.loaded == 0


def test_a_version_that_never_loads_holds_back_neither_lower_ones_nor_a_restart(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """A bogus announcement far ahead (its manifest never appears) is retried; the real versions
    announced after it still load, and a restarted generator catching up on the topic loads them too."""
    bogus = write_checkpoint(tmp_path / "bogus", "node-a", 2**62, _state(tokenizer, "tiny:9"))
    manifest = bogus.directory / "manifest.json"
    manifest.fs.rm_file(manifest.path)
    _announce(gen, policy_update(bogus, "node-a", 2**62))
    assert gen.metric(RETRIES, {"reason": "missing"}) == 1
    for version in (1, 2):
        state = _state(tokenizer, f"tiny:{version}")
        written = write_checkpoint(tmp_path / str(version), "node-a", version, state)
        _announce(gen, policy_update(written, "node-a", version))
        assert gen.follower.loaded == version
    assert torch.equal(_weights(gen), state["model.layers.0.mlp.up_proj.weight"])
    _poll_until(gen, lambda: gen.metric(FAILURES, {"reason": "missing"}) == 1)
    assert gen.health.failing() == [] and gen.follower.loaded == 2

    restarted = memory_generator(
        settings(),
        TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer),
        reload=FAST,
        bus=gen.bus,
    )
    restarted.follower.open()
    assert restarted.follower.catch_up()
    assert restarted.follower.loaded == 2 and restarted.follower.announced == 2**62
    assert torch.equal(_weights(restarted), state["model.layers.0.mlp.up_proj.weight"])


def test_a_newer_version_supersedes_one_being_retried(
    gen: MemoryGenerator, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    stuck = write_checkpoint(tmp_path, "node-a", 1, _state(tokenizer, "tiny:1"))
    shard = shard_of(stuck)
    shard.fs.rm_file(shard.path)
    _announce(gen, policy_update(stuck, "node-a", 1))
    newer = write_checkpoint(tmp_path / "newer", "node-a", 2, _state(tokenizer, "tiny:2"))
    _announce(gen, policy_update(newer, "node-a", 2))
    assert gen.follower.loaded == 2 and gen.health.failing() == []
    time.sleep(0.1)
    gen.follower.poll(0.0)
    assert gen.metric(RETRIES, {"reason": "missing"}) == 1  # v1 is not tried again


@pytest.mark.parametrize("scheme", ["absent", "nowhere"])
def test_a_manifest_url_this_generator_cannot_open_is_rejected_not_a_crash(
    gen: MemoryGenerator,
    tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scheme: str,
) -> None:
    """A trainer may write where this image has no filesystem for (gs:// without gcsfs) or announce a
    URL of no known protocol: the version is rejected and counted; a restart would meet it again."""
    monkeypatch.setitem(
        known_implementations, "absent", {"class": "absent_fs.AbsentFileSystem", "err": "Install absent-fs"}
    )
    written = write_checkpoint(tmp_path, "node-a", 1, _state(tokenizer, "tiny:1"))
    update = policy_pb2.PolicyUpdate.FromString(policy_update(written, "node-a", 1))
    update.manifest_uri = f"{scheme}://bucket/node-a/v00000001/manifest.json"
    _announce(gen, update.SerializeToString())
    assert gen.metric(FAILURES, {"reason": "checkpoint"}) == 1
    assert gen.follower.loaded == 0 and gen.health.failing() == [] and gen.health.alive()

    good = write_checkpoint(tmp_path / "good", "node-a", 2, _state(tokenizer, "tiny:2"))
    _announce(gen, policy_update(good, "node-a", 2))
    assert gen.follower.loaded == 2


def test_a_load_slower_than_the_hold_goes_on_while_the_loop_does(
    gen: MemoryGenerator,
    tokenizer: PreTrainedTokenizerBase,
    s3_url: str,
    elsewhere: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A version read over a slow link (its answers at most 2 MB/s: the tiny model's weights take six
    times the hold or more) leaves the loop with the old weights, not ready and alive, and is swapped
    in once read."""
    state = _state(tokenizer, "tiny:1")
    written = write_checkpoint(s3_url, "node-a", 1, state)
    before = _weights(gen)
    piece, hold_s = 200 * 1024, 1.0
    monkeypatch.setattr(policy, "LOAD_HOLD_S", hold_s)
    assert sum(entry.bytes for entry in written.manifest.weights) > 6 * hold_s * piece / 0.1
    with slow_link(os.environ["AWS_ENDPOINT_URL"], piece, 0.1) as endpoint:
        elsewhere(endpoint)
        _announce(gen, policy_update(written, "node-a", 1))
        assert gen.follower.loaded == 0 and torch.equal(_weights(gen), before)
        assert gen.health.failing() == ["weights_ok"] and gen.health.alive()
        _poll_until(gen, lambda: gen.follower.loaded == 1, timeout_s=60.0)
    assert torch.equal(_weights(gen), state["model.layers.0.mlp.up_proj.weight"])
    assert gen.health.failing() == [] and gen.metric(RETRIES, {"reason": "unavailable"}) == 0


def test_a_swapped_in_version_is_not_held_while_the_next_one_is_read(
    gen: MemoryGenerator,
    tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A version announced while the one before it was read is read next, at once: the weights just
    swapped in must not stay held beside it, a second copy of the model in memory (the vLLM backend
    copies what it is given)."""

    class Read(dict[str, torch.Tensor]):
        """A state dict that can be watched for being let go."""

    read_verified = policy.read_verified
    states: dict[int, weakref.ref[Read]] = {}
    held_when_read: dict[int, list[int]] = {}
    first_read = threading.Event()

    def read(update: policy_pb2.PolicyUpdate, shapes: Mapping[str, tuple[int, ...]] | None) -> Read:
        held_when_read[update.version] = [v for v, state in states.items() if state() is not None]
        if update.version == 1:
            assert first_read.wait(10.0)
        state = Read(read_verified(update, shapes))
        states[update.version] = weakref.ref(state)
        return state

    monkeypatch.setattr(policy, "read_verified", read)
    monkeypatch.setattr(policy, "LOAD_HOLD_S", 0.05)
    written = {
        v: write_checkpoint(tmp_path / str(v), "node-a", v, _state(tokenizer, f"tiny:{v}")) for v in (1, 2)
    }
    _announce(gen, policy_update(written[1], "node-a", 1))
    assert gen.follower.loaded == 0
    gen.bus.append(gen.topics.policy, b"node-a", policy_update(written[2], "node-a", 2), [])
    first_read.set()
    _poll_until(gen, lambda: gen.follower.loaded == 2)
    assert held_when_read == {1: [], 2: []}
