"""Warm start: which history groups are kept, which rounds are replayed, and what a restart resumes."""

from __future__ import annotations

import time

import pytest

from sapo import wire
from sapo.identity import Sender
from sapo.sampler import History, HistoryBuilder, SamplerCore, WarmStart, needs_warm_start
from sapo.sampler.settings import SamplerSettings
from sapo.sampler.warm import replay_rounds
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import InvalidMessageError
from tests.unit.sampler.builders import questions, real_group, sampler_core

pytestmark = pytest.mark.unit

NODE = "late"
RECORDS = questions(node_seed=31, count=24)


def _core(history: History | None = None, **overrides: object) -> SamplerCore[str]:
    values: dict[str, object] = {
        "node_id": NODE,
        "local_groups": 1,
        "external_groups": 1,
        "questions_per_round": 2,
        "max_per_source": 1,
    }
    return sampler_core(history, values | overrides)


def _warm(core: SamplerCore[str], **bounds: object) -> WarmStart[str]:
    cfg = SamplerSettings(node_id=NODE, warm_start={"enabled": True, **bounds})
    warm = core.warm_start(cfg.warm_start.config())
    assert warm is not None
    return warm


def _admit(warm: WarmStart[str], group: rollout_pb2.RolloutGroup, now: float) -> str | None:
    return warm.admit(group, group.group_id, now, Sender(group.node_id))


def test_lockstep_replays_every_round_before_the_join_round_and_stays_within_the_budget() -> None:
    assert replay_rounds({3, 5}, 0, 6, lockstep=True, budget=100) == [0, 1, 2, 3, 4, 5]
    assert replay_rounds({3, 5}, 4, 6, lockstep=True, budget=100) == [4, 5]  # resumed after round 3
    assert replay_rounds({3, 5}, 0, 6, lockstep=True, budget=2) == [4, 5]  # the newest rounds only
    assert replay_rounds(set(), 0, None, lockstep=True, budget=100) == []  # nothing read: join at once
    assert replay_rounds({9, 2, 5}, 0, None, lockstep=False, budget=2) == [5, 9]
    assert replay_rounds({9}, 0, 10, lockstep=True, budget=0) == []


def test_only_a_node_that_trained_nothing_live_warm_starts() -> None:
    assert needs_warm_start(History())
    assert needs_warm_start(History(next_sequence=3, next_round=3, batches=3, warm_batches=3))
    assert not needs_warm_start(History(next_sequence=4, next_round=4, batches=4, warm_batches=3))
    # the batch topic was re-created while the checkpoints stayed: the trainer trained already
    assert not needs_warm_start(History(trainer_next_sequence=12, trainer_version=12))
    assert (
        _core(History(next_sequence=1, next_round=1, batches=1)).warm_start(
            SamplerSettings(node_id=NODE).warm_start.config()
        )
        is None
    )


def test_history_is_screened_as_live_groups_with_its_own_age_bound() -> None:
    now = time.time()
    core = _core()
    warm = _warm(core, max_age_s=7200)
    two_hours_ago = now - 7000  # older than the live bound (900 s), within the history's
    assert _admit(warm, real_group(RECORDS[0], "peer-1", completed_s=two_hours_ago), now) is None
    assert _admit(warm, real_group(RECORDS[1], "peer-1", completed_s=now - 8000), now) == "too_old"
    assert _admit(warm, real_group(RECORDS[2], NODE), now) == "own_node"
    assert _admit(warm, real_group(RECORDS[3], "peer-1", (True, True)), now) == "no_signal"
    twice = real_group(RECORDS[4], "peer-2")
    assert _admit(warm, twice, now) is None
    assert _admit(warm, twice, now) == "duplicate"  # the topic may hold a group twice
    forged = real_group(RECORDS[5], "peer-1")
    forged.question.answer = "not the answer"
    with pytest.raises(InvalidMessageError):  # re-derivation, as live
        _admit(warm, forged, now)
    assert warm.read == 7
    assert warm.rejected == {"too_old": 1, "own_node": 1, "no_signal": 1, "duplicate": 1}


def test_the_newest_groups_are_kept_and_older_ones_evicted() -> None:
    now = time.time()
    warm = _warm(_core(), max_groups=2)
    groups = [real_group(RECORDS[i], "peer-1", completed_s=now - 100 + i) for i in range(3)]
    for group in (groups[2], groups[0], groups[1]):  # arrival order is not completion order
        assert _admit(warm, group, now) is None
    (evicted,) = warm.take_discards()
    assert (evicted.entry.group_id, evicted.reason) == (groups[0].group_id, "evicted")


def test_lockstep_batches_line_up_with_the_swarm_rounds_and_their_groups_are_used_once() -> None:
    now = time.time()
    core = _core()
    warm = _warm(core)
    round_1 = [real_group(RECORDS[i], f"peer-{i}", round_=1) for i in range(3)]
    round_3 = real_group(RECORDS[3], "peer-1", round_=3)
    for group in [*round_1, round_3, real_group(RECORDS[4], "peer-2", (False,) * 4, round_=4)]:
        _admit(warm, group, now)
    assert warm.highest_round == 4  # a group without signal still says where the swarm is
    assemblies = warm.plan(core.sequence, core.history.next_round)
    assert [len(a.external) for a in assemblies] == [0, 2, 0, 1]  # rounds 0..3; I + J = 2 per batch
    assert all(a.warm and not a.local for a in assemblies)
    (unused,) = warm.take_discards()  # round 1 had three groups for two places
    assert unused.reason == "unused"
    batches = []
    for assembly in assemblies:
        batches.append(core.build(assembly, [], wire.now_timestamp()))
        core.emitted()
    core.joined()
    assert [(b.sequence, b.round, b.warm_start) for b in batches] == [(i, i, True) for i in range(4)]
    assert {bg.source for b in batches for bg in b.groups} == {batch_pb2.GROUP_SOURCE_EXTERNAL}
    # the live stream reads the same history again: used groups are duplicates, replayed rounds closed
    assert core.admit(round_3, "external", "x", now, Sender("peer-1")) == "duplicate"
    assert core.admit(unused.entry.scored.group, "external", "y", now, Sender(unused.entry.scored.peer)) == (
        "late_round"
    )
    assert (
        core.admit(real_group(RECORDS[9], "peer-1", round_=4), "external", "z", now, Sender("peer-1")) is None
    )


def test_a_restart_during_warm_start_resumes_after_its_last_warm_batch() -> None:
    now = time.time()
    first = _core()
    warm = _warm(first)
    groups = [real_group(RECORDS[i], "peer-1", round_=i) for i in range(4)]
    for group in groups:
        _admit(warm, group, now)
    built = []
    for assembly in warm.plan(0, 0)[:2]:  # killed after two of three batches were acknowledged
        built.append(first.build(assembly, [], wire.now_timestamp()))
        first.emitted()
    folded = HistoryBuilder(NODE)
    for batch in built:
        folded.add(batch)
    history = folded.history()
    assert (history.batches, history.warm_batches, history.next_round) == (2, 2, 2)
    again = _core(history)
    warm = _warm(again, max_batches=1000)
    for group in groups:  # read from the beginning again
        _admit(warm, group, now)
    assert warm.rejected["duplicate"] == 2
    (rest,) = warm.plan(again.sequence, again.history.next_round)
    assert [e.group_id for e in rest.external] == [groups[2].group_id]
    assert again.build(rest, [], wire.now_timestamp()).sequence == 2
