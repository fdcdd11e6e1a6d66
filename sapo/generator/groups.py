"""Building rollout groups C(q) = (q, y_q, R(q), M) from one round's questions and sampled completions.

A round is a pure function of (task stream, round number, batch size): question i of round r is stream
position r * B + i, and the sampling seed is derived from (node seed, r). A restarted generator therefore
regenerates the same questions with the same seed; given the same weights, the same completions.
`generate_round` is that whole step (plan, sample in one backend call, build the groups), shared by the
generator service and the in-process swarm.

Failed generations keep `FINISH_REASON_ERROR` and carry no reward: scoring them 0 would teach the policy
that whatever produced the error was a wrong answer.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp
from transformers import PreTrainedTokenizerBase

from sapo.backends import FinishReason, GenerationBackend, Sample, SamplingConfig
from sapo.convert import question_to_proto
from sapo.tasks import QuestionRecord, TaskStream, prompt_ids, score
from sapo.tasks.seeds import stable_hash
from sapo.v1 import rollout_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp

FINISH_TO_WIRE: dict[FinishReason, rollout_pb2.FinishReason] = {
    "stop": rollout_pb2.FINISH_REASON_STOP,
    "length": rollout_pb2.FINISH_REASON_LENGTH,
    "error": rollout_pb2.FINISH_REASON_ERROR,
}


@dataclass(frozen=True)
class RoundPrompt:
    """One question of a round and its prompt token ids, exactly as fed to the model."""

    record: QuestionRecord
    prompt_ids: tuple[int, ...]


@dataclass(frozen=True)
class BatchContext:
    """What every group of one backend call shares: producer, policy, sampling and timing."""

    node_id: str
    model_id: str
    tokenizer_fingerprint: str
    policy_version: int
    round: int
    sampling: SamplingConfig
    created_at: Timestamp
    generate_seconds: float
    """Wall time of the whole batched call: the groups were generated together, not one by one."""


def round_seed(node_seed: int, round_: int) -> int:
    """The sampling seed of round `round_` on a node: reproducible, different per node and round."""
    return stable_hash("sampling", node_seed, round_) % 2**63


def plan_round(
    tokenizer: PreTrainedTokenizerBase, stream: TaskStream, round_: int, per_round: int
) -> list[RoundPrompt]:
    """The `per_round` questions of round `round_` (stream positions round_ * per_round + i) and prompts."""
    records = [stream.record_at(round_ * per_round + i) for i in range(per_round)]
    return [RoundPrompt(r, prompt_ids(tokenizer, r)) for r in records]


def sampling_params(config: SamplingConfig) -> rollout_pb2.SamplingParams:
    return rollout_pb2.SamplingParams(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed or 0,
        stop=list(config.stop),
    )


def to_completion(sample: Sample, record: QuestionRecord) -> rollout_pb2.Completion:
    """The wire completion of a sample, scored by the local verifier unless its generation failed.

    The prompt ends in the pre-filled "<answer>", so the text is scored with `prefilled=True`.
    """
    completion = rollout_pb2.Completion(
        text=sample.text,
        token_ids=list(sample.token_ids),
        logprobs=list(sample.logprobs),
        finish_reason=FINISH_TO_WIRE[sample.finish_reason],
        error=sample.error,
    )
    if sample.finish_reason != "error":
        completion.reward = score(record, sample.text, prefilled=True)
    return completion


def build_group(
    prompt: RoundPrompt, samples: Sequence[Sample], ctx: BatchContext
) -> rollout_pb2.RolloutGroup:
    """One RolloutGroup with a fresh UUID: regenerating a round yields new groups, never duplicates."""
    completions = [to_completion(s, prompt.record) for s in samples]
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=str(uuid.uuid4()),
        node_id=ctx.node_id,
        question=question_to_proto(prompt.record),
        completions=completions,
        model_id=ctx.model_id,
        tokenizer_fingerprint=ctx.tokenizer_fingerprint,
        policy_version=ctx.policy_version,
        sampling=sampling_params(ctx.sampling),
        created_at=ctx.created_at,
        completed_at=now_timestamp(),
        round=ctx.round,
        prompt_token_ids=list(prompt.prompt_ids),
        generate_seconds=ctx.generate_seconds,
    )


@dataclass(frozen=True)
class RoundSource:
    """What every round of one node's generator shares: who generates, with which model, how much and
    how. `sampling.seed` is ignored: each round samples with `round_seed(node_seed, round)`."""

    node_id: str
    model_id: str
    tokenizer_fingerprint: str
    node_seed: int
    questions_per_round: int
    sampling: SamplingConfig


@dataclass(frozen=True)
class GeneratedRound:
    """The groups of one round, and the wall time of the backend call that sampled them."""

    groups: list[rollout_pb2.RolloutGroup]
    generate_seconds: float


def generate_round(
    backend: GenerationBackend, stream: TaskStream, source: RoundSource, round_: int, version: int
) -> GeneratedRound:
    """Round `round_` of the node: its questions, all B x L completions in one backend call with the
    round's seed, scored and built into groups stamped with policy `version` (the weights the backend
    holds; the caller knows which, the backend is never asked to swap weights here)."""
    prompts = plan_round(backend.tokenizer, stream, round_, source.questions_per_round)
    sampling = dataclasses.replace(source.sampling, seed=round_seed(source.node_seed, round_))
    created_at = now_timestamp()
    started = time.perf_counter()
    samples = backend.generate([p.prompt_ids for p in prompts], sampling)
    seconds = time.perf_counter() - started
    ctx = BatchContext(
        node_id=source.node_id,
        model_id=source.model_id,
        tokenizer_fingerprint=source.tokenizer_fingerprint,
        policy_version=version,
        round=round_,
        sampling=sampling,
        created_at=created_at,
        generate_seconds=seconds,
    )
    groups = [build_group(p, s, ctx) for p, s in zip(prompts, samples, strict=True)]
    return GeneratedRound(groups, seconds)
