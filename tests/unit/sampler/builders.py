"""Real rollout groups for sampler tests: questions from real task streams, completions that are the
right answer or a wrong one, so the receiver's verifier gives rewards with variance."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from sapo.convert import question_to_proto
from sapo.identity import NodeKey, Sender, Signer
from sapo.sampler import AssemblyConfig, History, SamplerCore, Scored, Screen, ScreenConfig
from sapo.sampler.screen import Origin
from sapo.sampler.settings import SamplerSettings
from sapo.tasks import EASY_PROFILE, QuestionRecord, Split, TaskStream
from sapo.v1 import rollout_pb2
from sapo.wire import SCHEMA_VERSION, rollout_headers
from tests.factories import make_group

WRONG = "definitely not it</answer>"


def screen_config(node_id: str, **overrides: object) -> ScreenConfig:
    """The screen config of a sampler with default settings, with some values replaced."""
    return dataclasses.replace(SamplerSettings(node_id=node_id).screen_config(), **overrides)  # type: ignore[arg-type]


def assembly_config(**overrides: object) -> AssemblyConfig:
    """The assembly config of a sampler with default settings, with some values replaced."""
    return dataclasses.replace(SamplerSettings(node_id="node-0").assembly_config(), **overrides)  # type: ignore[arg-type]


def questions(node_seed: int, count: int, split: Split = "train") -> list[QuestionRecord]:
    return TaskStream(EASY_PROFILE, node_seed=node_seed, split=split).take(count)


def right(record: QuestionRecord) -> str:
    return f"{record.answer}</answer>"


def timestamp(epoch_s: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(epoch_s * 1e9))
    return ts


def real_group(
    record: QuestionRecord,
    node_id: str,
    correct: Sequence[bool] = (True, False, False, True),
    *,
    round_: int = 0,
    policy_version: int = 0,
    completed_s: float | None = None,
) -> rollout_pb2.RolloutGroup:
    """A group on `record` whose completions are right or wrong as `correct` says; the sender's
    reward field is honest (tests forge it explicitly)."""
    done = time.time() if completed_s is None else completed_s
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=str(uuid.uuid4()),
        node_id=node_id,
        question=question_to_proto(record),
        completions=[
            rollout_pb2.Completion(
                text=right(record) if ok else WRONG,
                token_ids=[1, 2, 3],
                finish_reason=rollout_pb2.FINISH_REASON_STOP,
                reward=1.0 if ok else 0.0,
            )
            for ok in correct
        ],
        model_id="tiny:0",
        policy_version=policy_version,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16),
        created_at=timestamp(done - 1.0),
        completed_at=timestamp(done),
        round=round_,
    )


def encoded(
    group: rollout_pb2.RolloutGroup, key: NodeKey | None = None
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """(value, headers) as a generator publishes them (signed with `key` when given)."""
    value = group.SerializeToString()
    return value, rollout_headers(group, value, Signer(key) if key is not None else None)


def honest(
    screen: Screen, group: rollout_pb2.RolloutGroup, origin: Origin, now_s: float, target_version: int
) -> Scored | str:
    """`Screen.check` of a group whose sender was verified to be the node it names."""
    return screen.check(group, origin, now_s, target_version, Sender(group.node_id))


def scored(
    origin: Origin = "external",
    peer: str = "peer-1",
    *,
    round_: int = 0,
    rewards: Sequence[float] = (1.0, 0.0),
    policy_version: int = 0,
    completed_s: float = 1000.0,
) -> Scored:
    """A Scored without running the pipeline, for assembler and selection tests."""
    group = make_group(node_id=peer, rewards=rewards)
    group.round = round_
    group.policy_version = policy_version
    mean = sum(rewards) / len(rewards)
    return Scored(group, origin, tuple(rewards), tuple(r - mean for r in rewards), completed_s)


def sampler_core(history: History | None, values: dict[str, object]) -> SamplerCore[str]:
    """The sampler core of a node with these settings values, continuing `history` (empty if None)."""
    settings = SamplerSettings(**values)  # type: ignore[arg-type]
    return settings.core(history or History())
