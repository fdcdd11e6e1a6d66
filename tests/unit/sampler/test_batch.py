"""The batch message, its offset ranges, the history a restart folds from the batch topic, and the
wire rule that lets a lock-step round emit an empty batch."""

from __future__ import annotations

import pytest

from sapo import wire
from sapo.sampler import HistoryBuilder, build_batch
from sapo.sampler.batch import offset_ranges, sequence_of
from sapo.v1 import batch_pb2
from tests.unit.sampler.builders import scored

pytestmark = pytest.mark.unit


def test_batch_carries_receiver_rewards_sources_and_target_version() -> None:
    groups = [scored("local", "node-0"), scored("external", "peer-1", rewards=(0.0, 1.0, 1.0))]
    batch = build_batch("node-0", 5, groups, [("t", 0, 3)], round_=None, created_at=wire.now_timestamp())
    assert wire.validate_batch(batch) is None
    assert (batch.batch_id, batch.sequence, batch.target_policy_version, batch.round) == ("node-0/5", 5, 5, 5)
    assert [bg.source for bg in batch.groups] == [
        batch_pb2.GROUP_SOURCE_LOCAL,
        batch_pb2.GROUP_SOURCE_EXTERNAL,
    ]
    assert list(batch.groups[1].rewards) == [0.0, 1.0, 1.0]
    assert len(batch.groups[1].advantages) == 3
    lockstep = build_batch("node-0", 5, [], [], round_=2, created_at=wire.now_timestamp())
    assert lockstep.round == 2


def test_empty_batches_need_only_their_id() -> None:
    assert wire.validate_batch(batch_pb2.TrainingBatch(batch_id="node-0/0")) is None
    assert wire.validate_batch(batch_pb2.TrainingBatch()) == "missing_batch_id"


def test_offsets_merge_into_contiguous_ranges() -> None:
    ranges = offset_ranges([("a", 0, 5), ("a", 0, 3), ("a", 0, 4), ("a", 1, 4), ("b", 0, 9), ("a", 0, 7)])
    assert [(r.topic, r.partition, r.first, r.last) for r in ranges] == [
        ("a", 0, 3, 5),
        ("a", 0, 7, 7),
        ("a", 1, 4, 4),
        ("b", 0, 9, 9),
    ]


def test_history_continues_after_the_highest_sequence_and_knows_every_used_group() -> None:
    now = wire.now_timestamp()
    first = build_batch("node-0", 0, [scored("local", "node-0")], [], round_=3, created_at=now)
    second = build_batch("node-0", 1, [scored("external", "peer-1")], [], round_=4, created_at=now)
    builder = HistoryBuilder("node-0")
    for batch in (second, first, second):  # any order, re-delivered duplicates included
        builder.add(batch)
    builder.add(build_batch("node-9", 50, [], [], round_=50, created_at=now))  # not ours: ignored
    history = builder.history()
    assert (history.next_sequence, history.next_round) == (2, 5)
    assert set(history.used_group_ids) == {first.groups[0].group.group_id, second.groups[0].group.group_id}


def test_an_undecodable_batch_still_holds_its_sequence() -> None:
    builder = HistoryBuilder("node-0")
    builder.add_undecodable(b"node-0/7")
    builder.add_undecodable(b"garbage")
    assert builder.history().next_sequence == 8
    assert sequence_of("node-0/12", "node-0") == 12
    assert sequence_of("node-1/12", "node-0") is None


def test_claimed_rewards_never_reach_a_batch() -> None:
    claimed = scored("external", "peer-1")._replace(advantages=(), verified=False)
    with pytest.raises(ValueError, match="unverified"):
        build_batch("node-0", 0, [claimed], [], round_=None, created_at=wire.now_timestamp())
