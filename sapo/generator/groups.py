"""Building rollout groups C(q) = (q, y_q, R(q), M) from work items and sampled completions.

A group is a pure function of its work item (`sapo.generator.work`): question `position` of round r is
stream position r * B + position, its completions are sampled with seeds derived from (node seed, r,
position), and its id from (node, r, position). A work item generated again (a replica died, a restart)
therefore yields the same question and group id; given the same weights, the same completions.
`generate_items` is that whole step for the items a replica holds (prompts, one backend call, scored
groups), shared by the generator service and the in-process swarm.

Failed generations keep `FINISH_REASON_ERROR` and carry no reward: scoring them 0 would teach the policy
that whatever produced the error was a wrong answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from sapo.backends import FinishReason, GenerationBackend, Sample, SamplingConfig
from sapo.convert import question_to_proto
from sapo.generator.work import Item, group_id, item_seed
from sapo.tasks import QuestionRecord, prompt_ids, score
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
    sampling: SamplingConfig
    created_at: Timestamp
    generate_seconds: float
    """Wall time of the whole batched call: the groups were generated together, not one by one."""


def sampling_params(config: SamplingConfig, seed: int) -> rollout_pb2.SamplingParams:
    return rollout_pb2.SamplingParams(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_new_tokens=config.max_new_tokens,
        seed=seed,
        stop=list(config.stop),
        quantization=config.quantization,
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
    prompt: RoundPrompt, samples: Sequence[Sample], ctx: BatchContext, item: Item, seed: int
) -> rollout_pb2.RolloutGroup:
    """The RolloutGroup of one work item, with the id and position the item determines."""
    completions = [to_completion(s, prompt.record) for s in samples]
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=group_id(ctx.node_id, item.round, item.position),
        node_id=ctx.node_id,
        question=question_to_proto(prompt.record),
        completions=completions,
        model_id=ctx.model_id,
        tokenizer_fingerprint=ctx.tokenizer_fingerprint,
        policy_version=ctx.policy_version,
        sampling=sampling_params(ctx.sampling, seed),
        created_at=ctx.created_at,
        completed_at=now_timestamp(),
        round=item.round,
        position=item.position,
        prompt_token_ids=list(prompt.prompt_ids),
        generate_seconds=ctx.generate_seconds,
    )


@dataclass(frozen=True)
class RoundSource:
    """What every group of one node's generator shares: who generates, with which model and seed, and
    how (`sampling.seed` is ignored: each item samples with `item_seed(node_seed, round, position)`)."""

    node_id: str
    model_id: str
    tokenizer_fingerprint: str
    node_seed: int
    sampling: SamplingConfig


@dataclass(frozen=True)
class Generated:
    """The groups of some work items, and the wall time of the backend call that sampled them."""

    groups: list[rollout_pb2.RolloutGroup]
    generate_seconds: float


def generate_items(
    backend: GenerationBackend,
    records: Sequence[QuestionRecord],
    source: RoundSource,
    items: Sequence[Item],
    version: int,
) -> Generated:
    """The groups of `items`, whose questions are `records` (`stream.record_at(item.stream_index)`,
    one per item, in order: a caller resolves them first so that an item whose question cannot be
    built is refused alone): all completions in one backend call (each item with its own seed),
    scored and stamped with policy `version` (the weights the backend holds; the caller knows which,
    the backend is never asked to swap weights here)."""
    prompts = [RoundPrompt(r, prompt_ids(backend.tokenizer, r)) for r in records]
    seeds = [item_seed(source.node_seed, item.round, item.position) for item in items]
    created_at = now_timestamp()
    started = time.perf_counter()
    samples = backend.generate([p.prompt_ids for p in prompts], source.sampling, seeds)
    seconds = time.perf_counter() - started
    ctx = BatchContext(
        node_id=source.node_id,
        model_id=source.model_id,
        tokenizer_fingerprint=source.tokenizer_fingerprint,
        policy_version=version,
        sampling=source.sampling,
        created_at=created_at,
        generate_seconds=seconds,
    )
    groups = [
        build_group(p, s, ctx, item, seed)
        for p, s, item, seed in zip(prompts, samples, items, seeds, strict=True)
    ]
    return Generated(groups, seconds)
