"""The generator service over the in-memory transport: work items in, groups out, policy pacing,
obsolete and duplicate items, failures, and groups that are the same whenever an item is sampled."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo import wire
from sapo.backends import Sample, TransformersBackend
from sapo.generator import Item, group_id
from sapo.generator.fingerprint import settings_fingerprint
from sapo.generator.settings import GeneratorSettings
from sapo.identity import NodeKey, Sender, TrustStore
from sapo.kafka import Record
from sapo.kafka.memory import MemoryConsumerClient
from sapo.models import build_tiny_model
from sapo.node.generator import GeneratorService
from sapo.settings import ConfigError
from sapo.tasks import EASY_PROFILE, MAX_POSITION, QuestionRecord, TaskStream, prompt_ids
from sapo.v1 import rollout_pb2
from tests.unit.generator.harness import (
    MemoryGenerator,
    ScriptedBackend,
    flip_byte,
    memory_generator,
    plan,
    policy_update,
    settings,
    write_checkpoint,
    wrong_answer,
)

pytestmark = pytest.mark.unit
SWARM = "sapo.swarm.rollouts"
STATE = {"w": torch.zeros(2)}


def _groups(gen: MemoryGenerator, topic: str) -> list[rollout_pb2.RolloutGroup]:
    return [wire.decode(rollout_pb2.RolloutGroup, v, 1 << 20) for v in gen.bus.values(topic)]


def _announce(gen: MemoryGenerator, root: Path, version: int, *, corrupt: bool = False) -> None:
    written = write_checkpoint(root, "node-a", version, STATE)
    if corrupt:
        flip_byte(written)
    gen.bus.append(gen.topics.policy, b"node-a", policy_update(written, "node-a", version), [])


def _run_idle(gen: MemoryGenerator, polls: int = 5) -> None:
    """Run the loop until it has gone `polls` iterations without new groups."""
    seen = [-1, 0]

    def until() -> bool:
        if gen.core.generated != seen[0]:
            seen[:] = [gen.core.generated, 0]
        else:
            seen[1] += 1
        return seen[1] > polls

    gen.core.run(until)


def test_every_group_goes_private_and_only_the_shared_subset_to_the_swarm(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    stream = TaskStream(EASY_PROFILE, 11, "train")
    records = [stream.record_at(i) for i in range(4)]
    answerable = {prompt_ids(tokenizer, r): r.answer for r in records[:2]}

    def script(prompt: Sequence[int], index: int) -> Sample:
        answer = answerable.get(tuple(prompt))
        if answer is not None and index == 0:
            return Sample(f"{answer}</answer>", (1, 2, 3), (-0.1, -0.2, -0.3), "stop")
        return wrong_answer(prompt, index)

    key = NodeKey.generate()
    config = settings(sharing="variance", identity={"private_key": key.pem().decode()})
    receiver = TrustStore()
    receiver.add("node-a", key.public, "file")
    gen = memory_generator(config, ScriptedBackend(tokenizer, script))
    plan(gen, 0, per_round=4)
    assert gen.core.run(until=lambda: gen.core.generated >= 4) == 4

    private, shared = _groups(gen, gen.topics.rollouts), _groups(gen, SWARM)
    assert [g.question.text for g in private] == [r.text for r in records]
    assert [(g.round, g.position) for g in private] == [(0, i) for i in range(4)]
    assert [g.group_id for g in private] == [group_id("node-a", 0, i) for i in range(4)]
    assert [g.group_id for g in shared] == [g.group_id for g in private[:2]]
    for record in gen.bus.topics[SWARM] + gen.bus.topics[gen.topics.rollouts]:
        assert record.value is not None
        group = wire.decode(rollout_pb2.RolloutGroup, record.value, 1 << 20)
        assert record.key == group.group_id.encode()
        assert receiver.identify(record.headers, record.value, 0.0) == Sender("node-a", key.key_id)
        assert wire.header_str(record.headers, wire.H_TASK) == group.question.task
        assert wire.read_generator_config(record.headers) == settings_fingerprint(config)
    for group in private[:2]:  # a wrong answer may earn format credit (fraction_simplification), never 1
        rewards = [c.reward for c in group.completions]
        assert rewards[0] == 1.0 and max(rewards[1:]) < 1.0
    assert sum(gen.metric("sapo_generator_groups_total", {"task": s.name}) or 0 for s in EASY_PROFILE) == 4
    assert gen.metric("sapo_generator_groups_shared_total") == 2
    assert gen.metric("sapo_generator_tokens_total") == 4 * 3 * 3
    assert gen.metric("sapo_generator_generate_seconds_count") == 1  # the four items in one call
    assert gen.metric("sapo_generator_work_items_total", {"outcome": "generated"}) == 4
    assert gen.bus.committed[("generator", (gen.topics.work, 0))] == 4  # finished after publishing


def test_failed_generations_are_published_unscored_and_counted(tokenizer: PreTrainedTokenizerBase) -> None:
    def script(prompt: Sequence[int], index: int) -> Sample:
        return (
            Sample.failed("RuntimeError: probability tensor contains nan")
            if index
            else wrong_answer(prompt, 0)
        )

    gen = memory_generator(settings(), ScriptedBackend(tokenizer, script))
    plan(gen, 0)
    gen.core.run(until=lambda: gen.core.generated >= 2)
    for group in _groups(gen, gen.topics.rollouts):
        assert [c.HasField("reward") for c in group.completions] == [True, False, False]
        assert [c.finish_reason for c in group.completions[1:]] == [rollout_pb2.FINISH_REASON_ERROR] * 2
    assert gen.metric("sapo_generator_completions_failed_total") == 2 * 2

    all_failed = memory_generator(settings(), ScriptedBackend(tokenizer, lambda p, i: Sample.failed("oom")))
    plan(all_failed, 0)
    all_failed.core.run(until=lambda: all_failed.core.generated >= 2)
    assert len(all_failed.bus.values(all_failed.topics.rollouts)) == 2
    assert all_failed.bus.values(SWARM) == []  # nobody can train on them: not worth the swarm's bandwidth


def test_lockstep_items_wait_for_their_version_and_are_stamped_with_it(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    plan(gen, 0)
    plan(gen, 1)  # published early: the replica holds round 1 until version 1 is loaded
    waits = 0

    def trainer() -> bool:
        nonlocal waits
        if gen.core.generated == 2 and gen.follower.announced == 0:
            waits += 1
            if waits == 5:
                assert len(backend.calls) == 1
                _announce(gen, tmp_path, 1)
        return gen.core.generated >= 4

    assert gen.core.run(trainer) == 4
    rounds = [(g.round, g.policy_version) for g in _groups(gen, gen.topics.rollouts)]
    assert rounds == [(0, 0)] * 2 + [(1, 1)] * 2
    assert [version for _, _, version in backend.calls] == [0, 1]


def test_an_idle_generator_waits_on_the_stream_that_can_unblock_it(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing held it waits on the work topic (a trainer announces a version, then plans that
    round's work); while held items wait for a version, on the policy topic."""
    waits: list[str] = []
    poll = MemoryConsumerClient.poll

    def recording(client: MemoryConsumerClient, timeout: float) -> Record | None:
        if timeout > 0:
            waits.append(client.group_id)
        return poll(client, timeout)

    monkeypatch.setattr(MemoryConsumerClient, "poll", recording)
    gen = memory_generator(settings(), ScriptedBackend(tokenizer))
    plan(gen, 0)
    _run_idle(gen)
    assert gen.core.generated == 2
    assert waits and set(waits) == {"generator"}
    waits.clear()
    plan(gen, 1)  # round 1 needs version 1, which no trainer announced
    _run_idle(gen)
    assert gen.core.generated == 2
    assert waits and set(waits) == {"generator-policy"}


def test_async_items_run_up_to_max_ahead_versions_ahead(tokenizer: PreTrainedTokenizerBase) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    plan(gen, 0, mode="async", max_ahead=1, rounds=3)  # rounds 0 and 1 need version 0
    _run_idle(gen)
    assert sorted({g.round for g in _groups(gen, gen.topics.rollouts)}) == [0, 1]
    assert gen.metric("sapo_generator_work_held_items") == 0


def test_items_the_swarm_moved_past_are_dropped_not_generated(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    _announce(gen, tmp_path, 3)
    plan(gen, 1)  # lock-step round 1 needs exactly version 1: a replica at version 3 drops it
    plan(gen, 3)
    _run_idle(gen)
    assert {(g.round, g.policy_version) for g in _groups(gen, gen.topics.rollouts)} == {(3, 3)}
    assert gen.metric("sapo_generator_work_items_total", {"outcome": "obsolete"}) == 2
    assert gen.bus.committed[("generator", (gen.topics.work, 0))] == 4


def test_an_item_planned_twice_is_sampled_once(tokenizer: PreTrainedTokenizerBase) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    plan(gen, 0)
    plan(gen, 0)  # a trainer that restarted before it committed its plan publishes round 0 again
    _run_idle(gen)
    assert len(_groups(gen, gen.topics.rollouts)) == 2
    assert gen.metric("sapo_generator_work_items_total", {"outcome": "duplicate"}) == 2


def test_an_item_planned_again_after_its_group_went_out_is_not_sampled_again(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    plan(gen, 0)
    _run_idle(gen)
    plan(gen, 0)  # the trainer restarted and planned round 0 once more
    _run_idle(gen)
    assert len(_groups(gen, gen.topics.rollouts)) == 2
    assert len(backend.calls) == 1
    assert gen.metric("sapo_generator_work_items_total", {"outcome": "duplicate"}) == 2
    gen.core.work.commit()
    assert gen.bus.committed[("generator", (gen.topics.work, 0))] == 4


def test_a_version_that_fails_to_load_holds_its_items_and_readiness(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    _announce(gen, tmp_path, 2, corrupt=True)
    plan(gen, 2)
    _run_idle(gen)
    assert backend.calls == []  # round 2 needs version 2, which did not load
    assert gen.follower.loaded == 0
    assert gen.health.failing() == ["weights_ok"]
    assert gen.metric("sapo_generator_work_held_items") == 2


def test_a_malformed_work_item_is_dead_lettered_and_the_rest_is_generated(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    gen = memory_generator(settings(), ScriptedBackend(tokenizer))
    gen.bus.append(gen.topics.work, b"x", b"\xff\xff not a work item", [])
    other = Item("node-b", 0, 0, 0, 0, 0).to_proto().SerializeToString()
    gen.bus.append(gen.topics.work, b"y", other, [])
    for index in (MAX_POSITION, 2**63 + 5):  # past the stream's end: once an uncaught IndexError
        beyond = Item("node-a", 0, 1, index, 0, 0).to_proto().SerializeToString()
        gen.bus.append(gen.topics.work, b"0/1", beyond, [])
    far = Item("node-a", 5, 0, 10, 1001, None).to_proto().SerializeToString()  # would wait for good
    gen.bus.append(gen.topics.work, b"5/0", far, [])
    plan(gen, 0)
    _run_idle(gen)
    assert len(_groups(gen, gen.topics.rollouts)) == 2
    dead = gen.bus.topics[gen.topics.dlq]
    reasons = sorted(r.headers["sapo-dlq-reason"].decode() for r in dead)
    assert reasons == [
        "index_out_of_range",
        "index_out_of_range",
        "undecodable",
        "version_too_far_ahead",
        "wrong_node",
    ]
    [lead] = [r for r in dead if r.headers["sapo-dlq-reason"] == b"version_too_far_ahead"]
    assert b"SAPO_GENERATOR_MAX_VERSION_LEAD" in lead.headers["sapo-dlq-detail"]
    assert gen.metric("sapo_generator_work_held_items") == 0
    assert gen.bus.committed[("generator", (gen.topics.work, 0))] == 7  # every record finished


def test_items_waiting_for_later_versions_are_served_as_each_version_loads(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """Async items of rounds 0..3 need versions 0..3: each version serves its items and those below,
    the others wait (readiness stays true: nothing they need has been announced yet)."""
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    for round_ in range(4):
        item = Item("node-a", round_, 0, round_ * 2, round_, None).to_proto().SerializeToString()
        gen.bus.append(gen.topics.work, f"{round_}/0".encode(), item, [])
    _run_idle(gen)
    assert [g.round for g in _groups(gen, gen.topics.rollouts)] == [0]
    assert gen.metric("sapo_generator_work_held_items") == 3
    assert gen.health.failing() == []
    _announce(gen, tmp_path / "v2", 2)
    _run_idle(gen)
    assert [g.round for g in _groups(gen, gen.topics.rollouts)] == [0, 1, 2]
    assert [g.policy_version for g in _groups(gen, gen.topics.rollouts)] == [0, 2, 2]
    assert gen.metric("sapo_generator_work_held_items") == 1
    _announce(gen, tmp_path / "v3", 3)
    _run_idle(gen)
    assert [g.round for g in _groups(gen, gen.topics.rollouts)] == [0, 1, 2, 3]
    assert gen.metric("sapo_generator_work_held_items") == 0
    assert gen.bus.committed[("generator", (gen.topics.work, 0))] == 4


def test_an_item_whose_question_cannot_be_built_is_refused_alone(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question that fails to build (a task library bug) fails its own item, not the backend call
    the round's other items share with it."""
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    stream = gen.core._stream
    record_at = stream.record_at

    def failing(position: int) -> QuestionRecord:
        if position == 1:
            raise ValueError("task generator failed")
        return record_at(position)

    monkeypatch.setattr(stream, "record_at", failing)
    plan(gen, 0)
    _run_idle(gen)
    assert [g.question.text for g in _groups(gen, gen.topics.rollouts)] == [record_at(0).text]
    [dead] = gen.bus.topics[gen.topics.dlq]
    assert dead.headers["sapo-dlq-reason"] == b"handler_error"
    assert gen.bus.committed[("generator", (gen.topics.work, 0))] == 2


def test_an_item_yields_the_same_group_whenever_and_with_whatever_it_is_sampled(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer)
    gen = memory_generator(settings(), backend)
    items = [Item("node-a", 4, i, 4 * 2 + i, 0, None) for i in range(2)]
    questions = [gen.core._stream.record_at(item.stream_index) for item in items]
    together = gen.core.generate(items, questions)
    alone = gen.core.generate(items[1:], questions[1:])  # another replica, another batch: the same group
    assert [g.group_id for g in together] == [group_id("node-a", 4, i) for i in range(2)]
    a, b = together[1], alone[0]
    assert a.group_id == b.group_id and a.sampling.seed == b.sampling.seed
    assert a.prompt_token_ids == b.prompt_token_ids
    assert [list(c.token_ids) for c in a.completions] == [list(c.token_ids) for c in b.completions]
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in a.completions)


def test_prepare_names_a_missing_vllm_and_a_missing_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Both failed after the lease with a traceback (ModuleNotFoundError, AssertionError)."""
    (tmp_path / "config.json").write_text("{}")  # an HF model directory, as vLLM takes
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    vllm = GeneratorSettings(node_id="n", model=str(tmp_path), backend="vllm")
    with pytest.raises(ConfigError, match=r"^SAPO_GENERATOR_BACKEND=vllm: vLLM is not installed.*BACKEND=hf"):
        GeneratorService.prepare(vllm)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^SAPO_GENERATOR_DEVICE=cuda:0: .*set SAPO_GENERATOR_DEVICE=cpu"):
        GeneratorService.prepare(GeneratorSettings(node_id="n", model="tiny:1", device="cuda:0"))
