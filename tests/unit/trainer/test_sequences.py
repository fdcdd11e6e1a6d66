"""Rows from batches: sampled ids kept at their sampling positions, peers' text re-tokenized, pi_old modes."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.backends import SamplingConfig, TransformersBackend
from sapo.convert import question_from_proto
from sapo.grpo.layout import pack
from sapo.grpo.logprobs import policy_logprobs
from sapo.tasks import ANSWER_PREFILL, STOP_STRINGS, prompt_ids
from sapo.trainer import ExternalLogprobs, RowMode, SequenceBuilder
from sapo.v1 import question_pb2
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.unit


def _builder(
    tokenizer: PreTrainedTokenizerBase, max_tokens: int = 1024, external: ExternalLogprobs = "on_policy"
) -> SequenceBuilder:
    return SequenceBuilder(tokenizer, max_sequence_tokens=max_tokens, external_logprobs=external)


def test_local_rows_reuse_prompt_and_sampled_ids_with_eos_and_behaviour_logprobs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    _, bad = b.answers(questions[0])
    texts = [questions[0].answer, bad]  # the model sampled its EOS; the length limit cut the other
    group = b.local_group(model, tokenizer, questions[0], texts, finish=[b.STOP, b.LENGTH])
    batch = b.training_batch(0, [b.batch_group(group, [1.0, 0.0])])

    rows = _builder(tokenizer).build(batch, current_version=0).rows

    assert [r.sample.prompt_ids for r in rows] == [tuple(group.prompt_token_ids)] * 2
    assert [r.sample.completion_ids for r in rows] == [tuple(c.token_ids) for c in group.completions]
    assert rows[0].sample.completion_ids[-1] == tokenizer.eos_token_id  # stopped: EOS is trained
    assert rows[1].sample.completion_ids[-1] != tokenizer.eos_token_id  # cut by length: no EOS
    assert rows[0].sample.behaviour_logprobs == pytest.approx(list(group.completions[0].logprobs))
    assert [r.mode for r in rows] == [RowMode.BEHAVIOUR] * 2
    assert [r.sample.advantage for r in rows] == pytest.approx(list(batch.groups[0].advantages))
    assert all(r.local for r in rows)
    # One version later the same group is stale: pi_old becomes the current policy, with IS correction.
    stale = _builder(tokenizer).build(batch, current_version=1)
    assert [r.mode for r in stale.rows] == [RowMode.CORRECTED] * 2
    assert stale.staleness == [1]


def test_a_completion_ends_alike_as_our_own_row_and_as_a_peers_retokenized_text(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    question = questions[0]
    # Ended by the stop string (the generator cuts there, no EOS), by the model's EOS, by the length limit.
    texts = [f"{question.answer}</answer>", question.answer, f"{question.answer} and"]
    finish = [b.STOP, b.STOP, b.LENGTH]
    own = b.local_group(model, tokenizer, question, texts, finish=finish)
    peer = b.external_group(question, texts, finish=finish)
    batch = b.training_batch(
        0, [b.batch_group(own, [1.0, 0.0, 0.0]), b.batch_group(peer, [1.0, 0.0, 0.0], b.EXTERNAL)]
    )

    rows = _builder(tokenizer).build(batch, current_version=0).rows

    local = [r.sample.completion_ids for r in rows if r.local]
    external = [r.sample.completion_ids for r in rows if not r.local]
    assert external == local
    eos = tokenizer.eos_token_id
    assert [ids[-1] == eos for ids in external] == [False, True, False]
    assert not any(eos in ids[:-1] for ids in external)


def test_training_scores_each_token_at_the_position_the_generator_sampled_it(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    backend = TransformersBackend(model, tokenizer)
    prompts = [b.prompt_ids(tokenizer, q) for q in questions[:2]]  # different lengths: left padding
    params = SamplingConfig(max_new_tokens=6, num_samples=2, temperature=0.7, seed=3, stop=STOP_STRINGS)
    groups = []
    for question, prompt, samples in zip(questions, prompts, backend.generate(prompts, params), strict=False):
        group = b.external_group(question, [s.text for s in samples], temperature=0.7)
        group.tokenizer_fingerprint = SequenceBuilder(tokenizer, max_sequence_tokens=64).fingerprint
        group.prompt_token_ids[:] = prompt
        for completion, sample in zip(group.completions, samples, strict=True):
            completion.token_ids[:] = sample.token_ids
            completion.logprobs[:] = sample.logprobs
        groups.append(b.batch_group(group, [1.0, 0.0]))
    rows = _builder(tokenizer).build(b.training_batch(0, groups), current_version=0).rows
    assert len(rows) == 4

    packed = pack([r.sample for r in rows], pad_token_id=0)  # one batch: rows of different lengths
    with torch.no_grad():
        trained = policy_logprobs(model, packed, temperature=0.7).logprobs
    for i, row in enumerate(rows):
        assert row.sample.behaviour_logprobs is not None
        got = trained[i][packed.completion_mask[i]]
        assert got.tolist() == pytest.approx(list(row.sample.behaviour_logprobs), abs=2e-4)


def test_external_text_is_retokenized_with_our_prompt_and_our_eos(
    tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    question = questions[1]
    good, bad = b.answers(question)
    texts = [good, bad, question.answer]
    group = b.external_group(question, texts, finish=[b.STOP, b.LENGTH, b.STOP])
    batch = b.training_batch(0, [b.batch_group(group, [1.0, 0.0, 1.0], b.EXTERNAL)])

    rows = _builder(tokenizer).build(batch, current_version=5).rows

    expected_prompt = prompt_ids(tokenizer, question_from_proto(question))
    assert rows[0].sample.prompt_ids == expected_prompt  # what our own generator feeds for it
    assert str(tokenizer.decode(list(rows[0].sample.prompt_ids))).endswith(ANSWER_PREFILL)
    eos = tokenizer.eos_token_id
    encoded = [tuple(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    # The stop string ended the first, the length limit the second, the sender's EOS the third.
    assert [r.sample.completion_ids for r in rows] == [encoded[0], encoded[1], (*encoded[2], eos)]
    assert [r.mode for r in rows] == [RowMode.ON_POLICY] * 3
    assert all(r.sample.behaviour_logprobs is None and not r.local for r in rows)


def test_external_rows_are_scored_at_the_receivers_sampling_temperature(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    own = b.local_group(model, tokenizer, questions[0], list(b.answers(questions[0])), temperature=0.8)
    text = b.external_group(questions[1], list(b.answers(questions[1])), temperature=0.5)
    ids = b.local_group(model, tokenizer, questions[2], list(b.answers(questions[2])), temperature=0.5)
    batch = b.training_batch(
        0,
        [
            b.batch_group(own, [1.0, 0.0]),
            b.batch_group(text, [1.0, 0.0], b.EXTERNAL),
            b.batch_group(ids, [1.0, 0.0], b.EXTERNAL),
        ],
    )
    for external in ("on_policy", "sender"):
        builder = SequenceBuilder(
            tokenizer, max_sequence_tokens=1024, external_logprobs=external, sampling_temperature=0.8
        )
        rows = builder.build(batch, current_version=0).rows
        # Our own rows at the temperature they were sampled at (their behaviour log-probs are at it);
        # the peers' rows at ours, whatever the senders sampled at.
        assert [r.temperature for r in rows] == pytest.approx([0.8] * 6)


def test_sender_logprobs_are_used_only_in_sender_mode_and_with_our_tokenizer(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    peer = b.local_group(model, tokenizer, questions[0], list(b.answers(questions[0])))
    external = b.batch_group(peer, [1.0, 0.0], b.EXTERNAL)
    batch = b.training_batch(0, [external])

    paper = _builder(tokenizer).build(batch, 0).rows
    sender = _builder(tokenizer, external="sender").build(batch, 0).rows
    assert [r.mode for r in paper] == [RowMode.ON_POLICY] * 2
    assert [r.mode for r in sender] == [RowMode.CORRECTED] * 2  # another node's policy: always corrected
    assert sender[0].sample.completion_ids == tuple(peer.completions[0].token_ids)

    external.group.tokenizer_fingerprint = (
        "0" * 64
    )  # another tokenizer: its ids and log-probs are meaningless here
    other = _builder(tokenizer, external="sender").build(b.training_batch(0, [external]), 0).rows
    assert [r.mode for r in other] == [RowMode.ON_POLICY] * 2
    text = peer.completions[0].text
    assert other[0].sample.completion_ids == tuple(tokenizer.encode(text, add_special_tokens=False))


def test_failures_are_skipped_and_long_rows_truncated_with_counts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    long_text = " ".join(["seven"] * 40) + "</answer>"
    texts = [long_text, "1</answer>", "x"]
    group = b.local_group(model, tokenizer, questions[0], texts, finish=[b.STOP, b.STOP, b.ERROR])
    bad_question = b.external_group(questions[1], ["2</answer>"])
    bad_question.question.provenance.dataset = "no_such_dataset"
    batch = b.training_batch(
        0, [b.batch_group(group, [1.0, 0.0, 0.0]), b.batch_group(bad_question, [1.0], b.EXTERNAL)]
    )
    limit = len(group.prompt_token_ids) + 10

    built = _builder(tokenizer, max_tokens=limit).build(batch, 0)

    assert [len(r.sample.completion_ids) for r in built.rows] == [10, len(group.completions[1].token_ids)]
    first = built.rows[0].sample
    assert first.behaviour_logprobs == pytest.approx(list(group.completions[0].logprobs[:10]))
    assert built.truncated == 1
    assert built.skipped == {"error": 1, "bad_question": 1}
    assert built.reward_mean() == pytest.approx(0.5)


def test_misaligned_logprobs_are_rejected_per_completion(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    group = b.local_group(model, tokenizer, questions[0], list(b.answers(questions[0])))
    del group.completions[1].logprobs[-1]
    built = _builder(tokenizer).build(b.training_batch(0, [b.batch_group(group, [1.0, 0.0])]), 0)
    assert len(built.rows) == 1
    assert built.skipped == {"bad_logprobs": 1}


def test_token_ids_outside_the_vocabulary_are_rejected_per_completion_or_group(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    vocab = len(tokenizer)
    group = b.local_group(model, tokenizer, questions[0], list(b.answers(questions[0])))
    group.completions[1].token_ids[0] = vocab  # one past the embedding: an IndexError in the step
    built = _builder(tokenizer).build(b.training_batch(0, [b.batch_group(group, [1.0, 0.0])]), 0)
    assert len(built.rows) == 1
    assert built.skipped == {"bad_token_id": 1}

    group.completions[1].token_ids[0] = vocab - 1
    group.prompt_token_ids[0] = 2**32 - 1  # the prompt every completion shares: the whole group goes
    built = _builder(tokenizer).build(b.training_batch(0, [b.batch_group(group, [1.0, 0.0])]), 0)
    assert built.rows == []
    assert built.skipped == {"bad_token_id": 2}


def test_completions_without_logprobs_train_on_policy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    group = b.local_group(model, tokenizer, questions[0], list(b.answers(questions[0])))
    for completion in group.completions:
        del completion.logprobs[:]
    rows = _builder(tokenizer).build(b.training_batch(0, [b.batch_group(group, [1.0, 0.0])]), 0).rows
    assert [r.mode for r in rows] == [RowMode.ON_POLICY] * 2
    assert rows[0].sample.completion_ids == tuple(group.completions[0].token_ids)


def test_rows_sampled_from_a_quantized_copy_are_importance_weighted_even_when_fresh(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, questions: list[question_pb2.Question]
) -> None:
    """Their behaviour log-probs are the int8 copy's, not the policy's: pi_old is the current policy and
    min(pi_old / pi_behaviour, cap) corrects for the difference, as for a stale row."""
    _, bad = b.answers(questions[0])
    group = b.local_group(
        model, tokenizer, questions[0], [questions[0].answer, bad], finish=[b.STOP, b.LENGTH]
    )
    group.sampling.quantization = "int8-dynamic"
    batch = b.training_batch(0, [b.batch_group(group, [1.0, 0.0])])
    built = _builder(tokenizer).build(batch, current_version=0)
    assert built.staleness == [0]
    assert [r.mode for r in built.rows] == [RowMode.CORRECTED] * 2
