"""Real TrainingBatch messages for trainer tests: easy-profile questions, our prompt, scored completions.

Local groups carry what a generator on our tokenizer would send: the prompt ids, the completion ids (a
completion that "stopped" ends with the EOS the model sampled, unless its text ends in a stop string: the
generator cuts those after the stop string, with no EOS), and behaviour log-probs computed by a given
model (so at staleness 0 the trainer's first ratio is 1). External groups carry only text, as a peer with
another tokenizer would.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.convert import question_from_proto, question_to_proto
from sapo.grpo.advantages import group_advantages
from sapo.grpo.layout import TrainSample, pack
from sapo.grpo.logprobs import policy_logprobs
from sapo.models import build_tiny_model, tokenizer_fingerprint
from sapo.tasks import EASY_PROFILE, STOP_STRINGS, TaskStream
from sapo.tasks import prompt_ids as encoded_prompt
from sapo.trainer import OptimConfig, StepConfig
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2, question_pb2, rollout_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp

STOP = rollout_pb2.FINISH_REASON_STOP
LENGTH = rollout_pb2.FINISH_REASON_LENGTH
ERROR = rollout_pb2.FINISH_REASON_ERROR
LOCAL = batch_pb2.GROUP_SOURCE_LOCAL
EXTERNAL = batch_pb2.GROUP_SOURCE_EXTERNAL


def optim_config(**overrides: object) -> OptimConfig:
    """The optimizer config of a trainer with default settings, with some values replaced."""
    return dataclasses.replace(TrainerSettings(node_id="node-a").optim_config(), **overrides)  # type: ignore[arg-type]


def step_config(**overrides: object) -> StepConfig:
    """The step config of a trainer with default settings, with some values replaced."""
    return dataclasses.replace(TrainerSettings(node_id="node-a").step_config(), **overrides)  # type: ignore[arg-type]


def tiny(tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> PreTrainedModel:
    """A fresh `tiny:<seed>` in eval mode (what `load_model` returns, without re-reading the tokenizer)."""
    model = build_tiny_model(tokenizer, seed=seed)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def questions(count: int, seed: int = 1, task: str = "basic_arithmetic") -> list[question_pb2.Question]:
    """The first `count` questions of `task` in a node's easy-profile stream (arithmetic prompts are
    ~90 tokens, which keeps tiny-model steps fast; propositional logic ones are ~360)."""
    found = (r for r in TaskStream(EASY_PROFILE, seed, "train") if r.task == task)
    return [question_to_proto(next(found)) for _ in range(count)]


def prompt_ids(tokenizer: PreTrainedTokenizerBase, question: question_pb2.Question) -> list[int]:
    return list(encoded_prompt(tokenizer, question_from_proto(question)))


def answers(question: question_pb2.Question) -> tuple[str, str]:
    """A right and a wrong completion text for the question (the wrong one never equals the answer)."""
    return f"{question.answer}</answer>", f"{question.answer} 0 wrong</answer>"


@torch.no_grad()
def score(
    model: PreTrainedModel,
    prompt: Sequence[int],
    completions: Sequence[Sequence[int]],
    temperature: float = 1.0,
) -> list[list[float]]:
    """Per-token log-probs of each completion after the prompt under `model` (fp32, no grad)."""
    samples = [TrainSample(prompt, c, 0.0) for c in completions]
    batch = pack(samples, pad_token_id=0)
    logprobs = policy_logprobs(model, batch, temperature).logprobs
    return [logprobs[i][batch.completion_mask[i]].tolist() for i in range(len(samples))]


def local_group(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    question: question_pb2.Question,
    texts: Sequence[str],
    *,
    policy_version: int = 0,
    temperature: float = 1.0,
    finish: Sequence[rollout_pb2.FinishReason] | None = None,
) -> rollout_pb2.RolloutGroup:
    """A group as our own generator would send it; `finish` defaults to STOP for every completion."""
    reasons = list(finish) if finish is not None else [STOP] * len(texts)
    prompt = prompt_ids(tokenizer, question)
    eos = int(tokenizer.eos_token_id)
    ids = [
        [*tokenizer.encode(t, add_special_tokens=False), *([eos] if ended_by_eos(t, r) else [])]
        for t, r in zip(texts, reasons, strict=True)
    ]
    logprobs = score(model, prompt, ids, temperature)
    completions = [
        rollout_pb2.Completion(
            text=t,
            token_ids=i if r != ERROR else [],
            logprobs=lp if r != ERROR else [],
            finish_reason=r,
            error="boom" if r == ERROR else "",
        )
        for t, i, lp, r in zip(texts, ids, logprobs, reasons, strict=True)
    ]
    fingerprint = tokenizer_fingerprint(tokenizer)
    return _group(
        question, completions, fingerprint, prompt, policy_version=policy_version, temperature=temperature
    )


def ended_by_eos(text: str, reason: rollout_pb2.FinishReason) -> bool:
    """As the generator: a stop string ends a completion without EOS; any other stop is the model's EOS."""
    return reason == STOP and not text.endswith(STOP_STRINGS)


def external_group(
    question: question_pb2.Question,
    texts: Sequence[str],
    *,
    finish: Sequence[rollout_pb2.FinishReason] | None = None,
    temperature: float = 1.0,
) -> rollout_pb2.RolloutGroup:
    """A peer's group: text only, another tokenizer (its ids and log-probs mean nothing to us)."""
    reasons = list(finish) if finish is not None else [STOP] * len(texts)
    completions = [
        rollout_pb2.Completion(
            text=t,
            token_ids=[7, 7, 7],
            logprobs=[-1.0] * 3,
            finish_reason=r,
            error="boom" if r == ERROR else "",
        )
        for t, r in zip(texts, reasons, strict=True)
    ]
    return _group(question, completions, "e" * 64, [5, 6], temperature=temperature, node_id="node-peer")


def _group(
    question: question_pb2.Question,
    completions: list[rollout_pb2.Completion],
    fingerprint: str,
    prompt: Sequence[int],
    *,
    policy_version: int = 0,
    temperature: float,
    node_id: str = "node-a",
) -> rollout_pb2.RolloutGroup:
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=str(uuid.uuid4()),
        node_id=node_id,
        question=question,
        completions=completions,
        model_id="tiny:0",
        tokenizer_fingerprint=fingerprint,
        policy_version=policy_version,
        sampling=rollout_pb2.SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=32),
        created_at=now_timestamp(),
        completed_at=now_timestamp(),
        prompt_token_ids=list(prompt),
    )


def batch_group(
    group: rollout_pb2.RolloutGroup,
    rewards: Sequence[float],
    source: batch_pb2.GroupSource = LOCAL,
) -> batch_pb2.BatchGroup:
    return batch_pb2.BatchGroup(
        group=group, source=source, rewards=list(rewards), advantages=group_advantages(rewards)
    )


def training_batch(
    sequence: int,
    groups: Sequence[batch_pb2.BatchGroup],
    *,
    node_id: str = "node-a",
    target_version: int | None = None,
) -> batch_pb2.TrainingBatch:
    return batch_pb2.TrainingBatch(
        schema_version=SCHEMA_VERSION,
        batch_id=f"{node_id}/{sequence}",
        node_id=node_id,
        sequence=sequence,
        target_policy_version=sequence if target_version is None else target_version,
        groups=list(groups),
        created_at=now_timestamp(),
        round=sequence,
    )
