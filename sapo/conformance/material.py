"""What the kit sends: real questions (re-derivable from their provenance) with right and wrong
completions, and the batches, work items and policy announcements other services would write.

Completions are answers in the generator's format (the prompt ends in "<answer>", so a completion is
"<answer text></answer>"); `truth` scores them with the task's own verifier, as any receiver must.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from sapo.convert import question_to_proto
from sapo.grpo.advantages import group_advantages
from sapo.tasks import EASY_PROFILE, QuestionRecord, Split, TaskStream, score
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import SCHEMA_VERSION

WRONG = "definitely not it</answer>"
KIT_SEED = 20_250


def timestamp(epoch_s: float) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.fromtimestamp(epoch_s, UTC))
    return ts


def questions(seed: int = KIT_SEED, split: Split = "train") -> TaskStream:
    """An endless stream of distinct questions of the easy profile (`next()` draws one)."""
    return TaskStream(EASY_PROFILE, node_seed=seed, split=split)


def right_text(record: QuestionRecord) -> str:
    return f"{record.answer}</answer>"


def group(
    record: QuestionRecord,
    node_id: str,
    correct: Sequence[bool] = (True, False, False, True),
    *,
    round_: int = 0,
    policy_version: int = 0,
    completed_s: float | None = None,
) -> rollout_pb2.RolloutGroup:
    """A group on `record` whose completions are right or wrong as `correct` says, with honest claimed
    rewards (callers forge them explicitly)."""
    done = time.time() if completed_s is None else completed_s
    completions = []
    for ok in correct:
        text = right_text(record) if ok else WRONG
        completions.append(
            rollout_pb2.Completion(
                text=text,
                token_ids=[1, 2, 3],
                finish_reason=rollout_pb2.FINISH_REASON_STOP,
                reward=score(record, text, prefilled=True),
            )
        )
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=str(uuid.uuid4()),
        node_id=node_id,
        question=question_to_proto(record),
        completions=completions,
        model_id="sapo-conformance-kit",
        tokenizer_fingerprint="",
        policy_version=policy_version,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16),
        created_at=timestamp(done - 1.0),
        completed_at=timestamp(done),
        round=round_,
    )


def truth(record: QuestionRecord, texts: Sequence[str]) -> list[float]:
    """The rewards a receiver's verifier gives these completion texts."""
    return [score(record, text, prefilled=True) for text in texts]


def batch_group(
    record: QuestionRecord, node_id: str, source: batch_pb2.GroupSource, round_: int
) -> batch_pb2.BatchGroup:
    """A group as a sampler puts it in a batch: the receiver's rewards and their GRPO advantages."""
    g = group(record, node_id, round_=round_, policy_version=round_)
    rewards = truth(record, [c.text for c in g.completions])
    return batch_pb2.BatchGroup(group=g, source=source, rewards=rewards, advantages=group_advantages(rewards))


def batch(
    node_id: str,
    sequence: int,
    groups: Sequence[batch_pb2.BatchGroup],
    *,
    epoch: int,
    round_: int | None = None,
) -> batch_pb2.TrainingBatch:
    return batch_pb2.TrainingBatch(
        schema_version=SCHEMA_VERSION,
        batch_id=f"{node_id}/{sequence}",
        node_id=node_id,
        sequence=sequence,
        target_policy_version=sequence,
        round=sequence if round_ is None else round_,
        groups=list(groups),
        created_at=timestamp(time.time()),
        epoch=epoch,
    )
