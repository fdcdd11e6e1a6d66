"""Group building: work items' questions and prompts, completions scored locally, failures never scored."""

from __future__ import annotations

import uuid

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.backends import Sample, SamplingConfig
from sapo.convert import question_from_proto
from sapo.generator import BatchContext, Item, RoundPrompt, build_group, group_id, item_seed, to_completion
from sapo.tasks import ANSWER_PREFILL, EASY_PROFILE, STOP_STRINGS, TaskStream, prompt_ids, render_prompt
from sapo.v1 import rollout_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp, validate_rollout_group

pytestmark = pytest.mark.unit


def _stream(node_seed: int = 11) -> TaskStream:
    return TaskStream(EASY_PROFILE, node_seed, "train")


def _prompts(
    tokenizer: PreTrainedTokenizerBase, stream: TaskStream, round_: int, per_round: int
) -> list[RoundPrompt]:
    """The prompts of a round's items, as `generate_items` builds them."""
    records = [stream.record_at(round_ * per_round + i) for i in range(per_round)]
    return [RoundPrompt(r, prompt_ids(tokenizer, r)) for r in records]


def _right(answer: str) -> Sample:
    return Sample(
        text=f"{answer}</answer>", token_ids=(5, 6, 2), logprobs=(-0.5, -0.1, -0.2), finish_reason="stop"
    )


def test_round_r_asks_stream_positions_r_times_b_onwards(tokenizer: PreTrainedTokenizerBase) -> None:
    stream = _stream()
    prompts = _prompts(tokenizer, stream, round_=3, per_round=4)
    assert [p.record for p in prompts] == [stream.record_at(12 + i) for i in range(4)]
    assert stream.position == 0  # random access: the stream itself does not move
    for p in prompts:
        text = render_prompt(tokenizer, p.record)
        assert text.endswith(ANSWER_PREFILL)
        assert list(p.prompt_ids) == tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(list(p.prompt_ids)) == text  # no padding, no doubled special tokens


def test_nodes_with_different_seeds_get_different_questions(tokenizer: PreTrainedTokenizerBase) -> None:
    a = [p.record.text for p in _prompts(tokenizer, _stream(1), 0, 8)]
    b = [p.record.text for p in _prompts(tokenizer, _stream(2), 0, 8)]
    assert a != b
    assert a == [p.record.text for p in _prompts(tokenizer, _stream(1), 0, 8)]


def test_completions_are_scored_but_failures_carry_no_reward() -> None:
    record = _stream().record_at(0)
    right = to_completion(_right(record.answer), record)
    assert right.HasField("reward") and right.reward == 1.0
    assert right.finish_reason == rollout_pb2.FINISH_REASON_STOP
    truncated = to_completion(Sample("abc", (1, 2), (-1.0, -1.0), "length"), record)
    assert truncated.HasField("reward") and truncated.reward == 0.0
    assert truncated.finish_reason == rollout_pb2.FINISH_REASON_LENGTH
    failed = to_completion(Sample.failed("RuntimeError: nan"), record)
    assert not failed.HasField("reward")
    assert failed.finish_reason == rollout_pb2.FINISH_REASON_ERROR
    assert failed.error == "RuntimeError: nan"


def test_group_carries_question_completions_and_provenance(tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = _prompts(tokenizer, _stream(), 2, 1)[0]
    sampling = SamplingConfig(max_new_tokens=16, num_samples=3, stop=STOP_STRINGS)
    ctx = BatchContext("node-a", "tiny:0", "f" * 64, 2, sampling, now_timestamp(), 1.5)
    samples = [_right(prompt.record.answer), Sample("x", (9,), (-3.0,), "length"), Sample.failed("oom")]
    item = Item("node-a", 2, 0, 2, 2, 2)
    group = build_group(prompt, samples, ctx, item, item_seed(11, 2, 0))

    assert validate_rollout_group(group) is None
    uuid.UUID(group.group_id)
    assert group.schema_version == SCHEMA_VERSION
    assert (group.node_id, group.model_id, group.policy_version, group.round) == ("node-a", "tiny:0", 2, 2)
    assert (group.position, group.group_id) == (0, group_id("node-a", 2, 0))
    assert group.tokenizer_fingerprint == "f" * 64
    assert question_from_proto(group.question) == prompt.record
    assert list(group.prompt_token_ids) == list(prompt.prompt_ids)
    assert [c.HasField("reward") for c in group.completions] == [True, True, False]
    assert list(group.completions[0].token_ids) == [5, 6, 2]
    assert list(group.completions[0].logprobs) == pytest.approx([-0.5, -0.1, -0.2])
    s = group.sampling
    assert (s.temperature, s.top_p, s.max_new_tokens, s.seed) == (1.0, 1.0, 16, item_seed(11, 2, 0))
    assert list(s.stop) == list(STOP_STRINGS)
    assert group.generate_seconds == 1.5
    assert group.created_at.ToDatetime() <= group.completed_at.ToDatetime()
    again = build_group(prompt, samples, ctx, item, item_seed(11, 2, 0))
    assert again.group_id == group.group_id  # an item sampled again is the same group: deduped by id
