"""The generator loop over the in-memory transport: publishing, sharing, failures, pacing, restarts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo import wire
from sapo.backends import Sample, TransformersBackend
from sapo.generator import plan_round
from sapo.identity import NodeKey, Sender, TrustStore
from sapo.models import build_tiny_model
from sapo.tasks import EASY_PROFILE, TaskStream
from sapo.v1 import rollout_pb2
from tests.unit.generator.harness import (
    MemoryGenerator,
    ScriptedBackend,
    flip_byte,
    memory_generator,
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


def _run_until_waiting(gen: MemoryGenerator, at_round: int, polls: int = 5) -> None:
    """Run the loop until it has checked `polls` times whether round `at_round` may start."""
    checks = 0

    def until() -> bool:
        nonlocal checks
        checks += gen.core.round == at_round
        return checks > polls

    gen.core.run(until)


def test_every_group_goes_private_and_only_the_shared_subset_to_the_swarm(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    prompts = plan_round(tokenizer, TaskStream(EASY_PROFILE, 11, "train"), 0, 4)
    answerable = {p.prompt_ids: p.record.answer for p in prompts[:2]}

    def script(prompt: Sequence[int], index: int) -> Sample:
        answer = answerable.get(tuple(prompt))
        if answer is not None and index == 0:
            return Sample(f"{answer}</answer>", (1, 2, 3), (-0.1, -0.2, -0.3), "stop")
        return wrong_answer(prompt, index)

    key = NodeKey.generate()
    config = settings(questions_per_round=4, sharing="variance", identity={"private_key": key.pem().decode()})
    receiver = TrustStore()
    receiver.add("node-a", key.public, "file")
    gen = memory_generator(config, ScriptedBackend(tokenizer, script))
    assert gen.core.run(until=lambda: gen.core.round >= 1) == 1

    private, shared = _groups(gen, gen.topics.rollouts), _groups(gen, SWARM)
    assert [g.question.text for g in private] == [p.record.text for p in prompts]
    assert [g.group_id for g in shared] == [g.group_id for g in private[:2]]
    for record in gen.bus.topics[SWARM] + gen.bus.topics[gen.topics.rollouts]:
        assert record.value is not None
        group = wire.decode(rollout_pb2.RolloutGroup, record.value, 1 << 20)
        assert record.key == group.group_id.encode()
        assert receiver.identify(record.headers, record.value, 0.0) == Sender("node-a", key.key_id)
        assert wire.header_str(record.headers, wire.H_TASK) == group.question.task
    for group in private[:2]:  # a wrong answer may earn format credit (fraction_simplification), never 1
        rewards = [c.reward for c in group.completions]
        assert rewards[0] == 1.0 and max(rewards[1:]) < 1.0
    assert sum(gen.metric("sapo_generator_groups_total", {"task": s.name}) or 0 for s in EASY_PROFILE) == 4
    assert gen.metric("sapo_generator_groups_shared_total") == 2
    assert gen.metric("sapo_generator_tokens_total") == 4 * 3 * 3
    assert gen.metric("sapo_generator_generate_seconds_count") == 1


def test_failed_generations_are_published_unscored_and_counted(tokenizer: PreTrainedTokenizerBase) -> None:
    def script(prompt: Sequence[int], index: int) -> Sample:
        return (
            Sample.failed("RuntimeError: probability tensor contains nan")
            if index
            else wrong_answer(prompt, 0)
        )

    gen = memory_generator(settings(), ScriptedBackend(tokenizer, script))
    gen.core.run(until=lambda: gen.core.round >= 1)
    for group in _groups(gen, gen.topics.rollouts):
        assert [c.HasField("reward") for c in group.completions] == [True, False, False]
        assert [c.finish_reason for c in group.completions[1:]] == [rollout_pb2.FINISH_REASON_ERROR] * 2
    assert gen.metric("sapo_generator_completions_failed_total") == 2 * 2

    all_failed = memory_generator(settings(), ScriptedBackend(tokenizer, lambda p, i: Sample.failed("oom")))
    all_failed.core.run(until=lambda: all_failed.core.round >= 1)
    assert len(all_failed.bus.values(all_failed.topics.rollouts)) == 2
    assert all_failed.bus.values(SWARM) == []  # nobody can train on them: not worth the swarm's bandwidth


def test_lockstep_waits_for_the_trainers_version_and_stamps_it(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    waits = 0

    def trainer(at: int = 1) -> bool:
        nonlocal waits
        if gen.core.round == at and gen.follower.announced == 0:
            waits += 1
            if waits == 5:  # the generator waited: now the trainer announces version 1
                assert len(backend.calls) == 1
                _announce(gen, tmp_path, 1)
        return gen.core.round >= 2

    assert gen.core.run(trainer) == 2
    assert [(g.round, g.policy_version) for g in _groups(gen, gen.topics.rollouts)] == [(0, 0)] * 2 + [
        (1, 1)
    ] * 2
    assert [version for _, _, version in backend.calls] == [0, 1]


def test_async_runs_at_most_max_ahead_rounds_past_the_loaded_version(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(round_mode="async", max_ahead=1), backend)
    _run_until_waiting(gen, at_round=2)
    assert gen.core.round == 2
    assert len(backend.calls) == 2  # rounds 0 and 1 with version 0; round 2 needs version 1


def test_a_restart_resumes_at_the_latest_announced_version(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    for version in (1, 2, 3):
        _announce(gen, tmp_path, version)
    gen.core.run(until=lambda: gen.core.round >= 4)
    groups = _groups(gen, gen.topics.rollouts)
    assert {(g.round, g.policy_version) for g in groups} == {(3, 3)}
    # Round 3 of a node asks stream positions 6 and 7 (B = 2), whoever generates it.
    stream = TaskStream(EASY_PROFILE, 11, "train")
    assert [g.question.text for g in groups] == [stream.record_at(p).text for p in (6, 7)]


def test_a_latest_version_that_fails_to_load_is_waited_out_not_generated_past(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    backend = ScriptedBackend(tokenizer)
    gen = memory_generator(settings(), backend)
    _announce(gen, tmp_path, 2, corrupt=True)
    _run_until_waiting(gen, at_round=2)
    assert backend.calls == []  # not round 0 with version 0: the node is at round 2
    assert gen.follower.loaded == 0
    assert gen.health.failing() == ["weights_ok"]


def test_round_limit_ends_the_run(tokenizer: PreTrainedTokenizerBase) -> None:
    gen = memory_generator(settings(round_mode="async", max_ahead=5, rounds=3), ScriptedBackend(tokenizer))
    assert gen.core.run() == 3
    assert sorted({g.round for g in _groups(gen, gen.topics.rollouts)}) == [0, 1, 2]


def test_a_round_regenerates_identically_with_the_same_weights(tokenizer: PreTrainedTokenizerBase) -> None:
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer)
    gen = memory_generator(settings(), backend)
    first, again = gen.core.run_round(4), gen.core.run_round(4)
    assert [g.group_id for g in first] != [g.group_id for g in again]
    for a, b in zip(first, again, strict=True):
        assert [list(c.token_ids) for c in a.completions] == [list(c.token_ids) for c in b.completions]
        assert a.prompt_token_ids == b.prompt_token_ids and a.sampling.seed == b.sampling.seed
        assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in a.completions)
