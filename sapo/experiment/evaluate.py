"""Held-out evaluation: a policy's reward on questions of the eval split that no node trains on.

Every node of every run is measured on the same questions (one eval stream, fixed seed) with the same
sampling seed, so before/after and node-to-node differences are differences of the policy only.
Reported: mean reward at temperature 1.0 (what the policy does when it samples, as in training) and
accuracy (share of completions with full reward), per task, and per question (its mean over the
samples, with its task): the analysis pairs policies question by question and resamples questions for
its intervals.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.backends import SamplingConfig, TransformersBackend
from sapo.checkpoints import CheckpointStore, load_weights
from sapo.models import load_model
from sapo.tasks import (
    STOP_STRINGS,
    QuestionRecord,
    TaskStream,
    load_profile,
    prompt_ids,
    score,
)

EVAL_STREAM_SEED = 0
"""The eval split is disjoint from every train stream by construction (sapo.tasks); one seed for all."""
SAMPLING_SEED = 4242
_CHUNK = 16


@dataclass(frozen=True)
class Evaluation:
    questions: int
    samples: int
    reward_mean: float
    accuracy: float
    per_task: dict[str, float]
    per_question: list[float] = field(default_factory=list)
    """Mean reward of each question over its samples, in the eval stream's order."""
    question_tasks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ScoredQuestion:
    """One question's sampled completion texts and their rewards."""

    record: QuestionRecord
    texts: list[str]
    rewards: list[float]


def sample_and_score(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[QuestionRecord],
    *,
    samples: int,
    max_new_tokens: int,
    seed: int = SAMPLING_SEED,
) -> list[ScoredQuestion]:
    """`samples` completions of each question at temperature 1.0 (fixed seed), scored locally."""
    backend = TransformersBackend(model, tokenizer)
    params = SamplingConfig(
        max_new_tokens=max_new_tokens, num_samples=samples, temperature=1.0, seed=seed, stop=STOP_STRINGS
    )
    out: list[ScoredQuestion] = []
    model.eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        for start in range(0, len(records), _CHUNK):
            part = records[start : start + _CHUNK]
            prompts = [prompt_ids(tokenizer, r) for r in part]
            for record, group in zip(part, backend.generate(prompts, params), strict=True):
                texts = [s.text for s in group]
                out.append(ScoredQuestion(record, texts, [score(record, t, prefilled=True) for t in texts]))
    return out


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task_profile: str,
    *,
    questions: int,
    samples: int,
    max_new_tokens: int,
) -> Evaluation:
    """Sample `samples` completions of each of the first `questions` eval questions and score them."""
    records = TaskStream(load_profile(task_profile), EVAL_STREAM_SEED, "eval").take(questions)
    scored = sample_and_score(model, tokenizer, records, samples=samples, max_new_tokens=max_new_tokens)
    per_task: dict[str, list[float]] = {}
    for item in scored:
        per_task.setdefault(item.record.task, []).extend(item.rewards)
    rewards = [r for values in per_task.values() for r in values]
    return Evaluation(
        questions=len(records),
        samples=samples,
        reward_mean=statistics.fmean(rewards),
        accuracy=statistics.fmean(r >= 1.0 for r in rewards),
        per_task={task: statistics.fmean(v) for task, v in sorted(per_task.items())},
        per_question=[statistics.fmean(item.rewards) for item in scored],
        question_tasks=[item.record.task for item in scored],
    )


def load_final_policy(
    model_ref: str, checkpoint_root: Path, node_id: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, int]:
    """The node's latest checkpointed weights on top of its base model; returns the version too."""
    model, tokenizer = load_model(model_ref, dtype=torch.float32)
    store = CheckpointStore(checkpoint_root)
    latest = store.latest(node_id)
    if latest is None:
        raise FileNotFoundError(f"no checkpoint of {node_id} under {checkpoint_root}")
    model.load_state_dict(load_weights(latest.manifest, latest.directory), strict=True)
    return model, tokenizer, latest.manifest.version
