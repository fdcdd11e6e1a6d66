"""Builders of valid wire messages for tests."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sapo.v1 import question_pb2, rollout_pb2
from sapo.wire import SCHEMA_VERSION, now_timestamp


def make_group(
    node_id: str = "node-a",
    task: str = "basic_arithmetic",
    rewards: Sequence[float] = (1.0, 0.0, 0.0, 1.0),
    group_id: str | None = None,
) -> rollout_pb2.RolloutGroup:
    question = question_pb2.Question(
        task=task,
        text="What is 2 + 3?",
        answer="5",
        metadata_json="{}",
        provenance=question_pb2.Provenance(
            dataset=task,
            config_json="{}",
            config_digest="0" * 64,
            seed=7,
            index=3,
            split=question_pb2.SPLIT_TRAIN,
        ),
    )
    completions = [
        rollout_pb2.Completion(
            text="5</answer>" if r else "6</answer>",
            token_ids=[11, 12, 2],
            logprobs=[-0.5, -0.25, -0.125],
            finish_reason=rollout_pb2.FINISH_REASON_STOP,
            reward=r,
        )
        for r in rewards
    ]
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=group_id or str(uuid.uuid4()),
        node_id=node_id,
        question=question,
        completions=completions,
        model_id="tiny:0",
        tokenizer_fingerprint="f" * 64,
        policy_version=0,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16),
        created_at=now_timestamp(),
        completed_at=now_timestamp(),
    )
