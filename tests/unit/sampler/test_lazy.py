"""Lazy verification (SAPO_SAMPLER_VERIFY=lazy) on real groups: the cheap arrival filters, verification
when the selection picks a group, rejected picks replaced, and the same batches as eager for honest
senders."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from sapo.sampler import (
    Assembler,
    Entry,
    Mix,
    RoundMode,
    Scored,
    Screen,
    SeenGroups,
    SelectionPolicy,
    VerifyMode,
    make_assembler,
    pick_external,
)
from sapo.tasks import QuestionRecord
from sapo.v1 import rollout_pb2
from sapo.wire import InvalidMessageError
from tests.unit.sampler.builders import assembly_config, honest, questions, real_group, scored, screen_config

pytestmark = pytest.mark.unit

NODE = "node-0"
RECORDS = questions(node_seed=17, count=24)
T0 = time.time()
"""The clock these tests judge with: their groups are completed at it, not when a test runs (a run can
reach this module long after it was imported, and a group dated later would be `clock_ahead`)."""


def _group(record: QuestionRecord, node_id: str, *args: Any, **kwargs: Any) -> rollout_pb2.RolloutGroup:
    """`real_group`, completed at T0."""
    return real_group(record, node_id, *args, completed_s=T0, **kwargs)


def _screen(verify: VerifyMode = VerifyMode.LAZY) -> Screen:
    cfg = screen_config(NODE, max_external_age_s=600.0, max_policy_lag=4, verify=verify)
    return Screen(cfg, SeenGroups(1000))


def _assembler(screen: Screen, mode: RoundMode, mix: Mix, **overrides: object) -> Assembler[str]:
    base: dict[str, object] = {
        "mode": mode,
        "mix": mix,
        "selection": SelectionPolicy.UNIFORM,
        "max_per_source": 1,
        "max_pool_groups": 256,
        "max_external_age_s": 600.0,
        "max_policy_lag": 4,
        "questions_per_round": 2,
        "expected_peers": 2,
        "deadline_s": 5.0,
    }
    return make_assembler(assembly_config(**(base | overrides)), verify=screen.verify)


def _tampered(index: int, peer: str, round_: int = 0) -> rollout_pb2.RolloutGroup:
    group = _group(RECORDS[index], peer, round_=round_)
    group.question.answer += "0"
    return group


def _claims_signal_has_none(index: int, peer: str, round_: int = 0) -> rollout_pb2.RolloutGroup:
    """Every completion is wrong, but the sender claims one is right."""
    group = _group(RECORDS[index], peer, (False, False, False), round_=round_)
    group.completions[0].reward = 1.0
    return group


def _pool(
    screen: Screen, assembler: Assembler[str], groups: Sequence[rollout_pb2.RolloutGroup], origin: str
) -> None:
    for group in groups:
        verdict = honest(screen, group, origin, T0, 0)  # type: ignore[arg-type]
        assert isinstance(verdict, Scored), verdict
        assembler.arrived(group.node_id, group.group_id, group.round, verdict.origin, T0)
        assert assembler.add(verdict, group.group_id, T0) is None


def test_arrival_runs_only_the_cheap_filters_on_external_groups() -> None:
    screen = _screen()
    tampered = honest(screen, _tampered(0, "peer-1"), "external", T0, 0)
    assert isinstance(tampered, Scored)
    assert not tampered.verified
    assert tampered.rewards == (1.0, 0.0, 0.0, 1.0)  # the sender's claims, not yet the receiver's
    assert tampered.advantages == ()
    with pytest.raises(InvalidMessageError) as info:
        screen.verify(tampered)
    assert info.value.reason == "answer_mismatch"
    no_claim = _group(RECORDS[2], "peer-1", (True, False))
    no_claim.completions[0].reward = 0.0
    assert honest(screen, no_claim, "external", T0, 0) == "no_signal_claimed"
    nan_claim = _group(RECORDS[2], "peer-1", (True, False))
    nan_claim.completions[0].reward = float("nan")
    assert honest(screen, nan_claim, "external", T0, 0) == "no_signal_claimed"
    errored = _group(RECORDS[2], "peer-1", (True, False))
    errored.completions[0].finish_reason = rollout_pb2.FINISH_REASON_ERROR
    assert honest(screen, errored, "external", T0, 0) == "too_few_completions"
    unset_split = _group(RECORDS[2], "peer-1")
    unset_split.question.provenance.ClearField("split")
    with pytest.raises(InvalidMessageError, match="missing_split"):
        honest(screen, unset_split, "external", T0, 0)


def test_local_groups_are_verified_on_arrival() -> None:
    with pytest.raises(InvalidMessageError) as info:
        honest(_screen(), _tampered(1, NODE), "local", T0, 0)
    assert info.value.reason == "answer_mismatch"
    local = honest(_screen(), _group(RECORDS[1], NODE), "local", T0, 0)
    assert isinstance(local, Scored)
    assert local.verified


def test_verification_recomputes_rewards_and_drops_error_completions() -> None:
    group = _group(RECORDS[3], "peer-1", (True, False, False, True))
    group.completions[1].reward = 1.0  # forged: the text is wrong
    group.completions[3].finish_reason = rollout_pb2.FINISH_REASON_ERROR
    pending = honest(_screen(), group, "external", T0, 0)
    assert isinstance(pending, Scored)
    assert pending.rewards == (1.0, 1.0, 0.0)  # claimed, of the three scored completions
    verified = _screen().verify(pending)
    assert isinstance(verified, Scored)
    assert verified.verified
    assert len(verified.group.completions) == len(verified.rewards) == len(verified.advantages) == 3
    assert verified.rewards[0] == 1.0
    assert verified.rewards[1] == verified.rewards[2] < 1.0
    assert _screen().verify(verified) is verified
    no_signal = honest(_screen(), _claims_signal_has_none(4, "peer-1"), "external", T0, 0)
    assert isinstance(no_signal, Scored)
    assert _screen().verify(no_signal) == "no_signal"


def test_rejected_picks_are_replaced_and_dead_lettered_where_eager_would() -> None:
    screen = _screen()
    assembler = _assembler(screen, RoundMode.ASYNC, Mix(1, 2))
    _pool(screen, assembler, [_group(RECORDS[5], NODE)], "local")
    bad = [_tampered(6, "peer-1"), _claims_signal_has_none(7, "peer-2")]
    _pool(screen, assembler, [*bad, _group(RECORDS[8], "peer-3")], "external")
    # Three external groups count for J=2; verification rejects two, so the batch waits, as eager would.
    assert assembler.next_batch(T0, 0) is None
    discards = {d.entry.group_id: d for d in assembler.take_discards()}
    assert {gid: d.reason for gid, d in discards.items()} == {
        bad[0].group_id: "answer_mismatch",
        bad[1].group_id: "no_signal",
    }
    error = discards[bad[0].group_id].error
    assert error is not None
    assert error.reason == "answer_mismatch"
    assert discards[bad[1].group_id].error is None  # no signal is a normal event: counted only
    [kept] = assembler.pool.entries("external")
    assert kept.scored.verified  # verified once, never again
    _pool(screen, assembler, [_group(RECORDS[9], "peer-4")], "external")
    batch = assembler.next_batch(T0, 0)
    assert batch is not None
    assert (len(batch.local), len(batch.external)) == (1, 2)
    assert all(e.scored.verified and len(e.scored.advantages) == 4 for e in batch.entries)


def _deadline_run(verify: VerifyMode) -> list[tuple[int, int] | None]:
    screen = _screen(verify)
    assembler = _assembler(screen, RoundMode.DEADLINE, Mix(2, 2))
    _pool(screen, assembler, [_group(r, NODE) for r in RECORDS[10:13]], "local")
    external = [_group(RECORDS[13], "peer-1"), _claims_signal_has_none(14, "peer-2")]
    for group in external:
        verdict = honest(screen, group, "external", T0, 0)
        if isinstance(verdict, Scored):
            assembler.add(verdict, group.group_id, T0)
    out: list[tuple[int, int] | None] = []
    for now in (T0, T0 + 4.9, T0 + 5.0):
        batch = assembler.next_batch(now, 0)
        out.append(None if batch is None else (len(batch.local), len(batch.external)))
    return out


def test_deadline_fills_from_local_after_a_rejection_exactly_as_eager() -> None:
    assert _deadline_run(VerifyMode.LAZY) == _deadline_run(VerifyMode.EAGER) == [None, None, (3, 1)]


def test_lockstep_replans_the_round_after_rejected_picks() -> None:
    screen = _screen()
    assembler = _assembler(screen, RoundMode.LOCKSTEP, Mix(2, 2))
    _pool(screen, assembler, [_group(r, NODE) for r in RECORDS[15:17]], "local")
    tampered = _tampered(17, "peer-1")
    _pool(screen, assembler, [tampered, _group(RECORDS[18], "peer-2")], "external")
    batch = assembler.next_batch(T0, 0)
    assert batch is not None
    assert (len(batch.local), len(batch.external)) == (2, 1)
    assert batch.external[0].scored.peer == "peer-2"
    assert [(d.entry.group_id, d.reason) for d in assembler.take_discards()] == [
        (tampered.group_id, "answer_mismatch")
    ]


def test_unverified_groups_need_an_assembler_that_verifies() -> None:
    pending = honest(_screen(), _group(RECORDS[0], "peer-1"), "external", T0, 0)
    assert isinstance(pending, Scored)
    cfg = assembly_config(
        mode=RoundMode.ASYNC, mix=Mix(1, 1), max_per_source=1, max_pool_groups=8, max_external_age_s=600.0
    )
    assembler: Assembler[str] = make_assembler(cfg)
    with pytest.raises(ValueError, match="verify"):
        assembler.add(pending, "h", T0)


@pytest.mark.parametrize("mode", [RoundMode.ASYNC, RoundMode.LOCKSTEP])
def test_honest_senders_get_the_same_batches_as_eager(mode: RoundMode) -> None:
    """Same pool, same seed: lazy picks exactly eager's groups (the walk draws no extra randomness),
    with the same rewards and advantages."""
    peers = [f"peer-{i % 5}" for i in range(15)]
    external = [_group(RECORDS[i], peer, (i % 2 == 0, True, False)) for i, peer in enumerate(peers)]
    local = [_group(r, NODE) for r in RECORDS[15:19]]
    picks = {}
    for verify in VerifyMode:
        screen = _screen(verify)
        assembler = _assembler(screen, mode, Mix(2, 4), max_per_source=2, questions_per_round=4)
        _pool(screen, assembler, local, "local")
        _pool(screen, assembler, external, "external")
        batches = [assembler.next_batch(T0, seq) for seq in range(2 if mode is RoundMode.ASYNC else 1)]
        picks[verify] = [
            [(e.group_id, e.scored.rewards, e.scored.advantages) for e in b.entries] for b in batches if b
        ]
        assert all(e.scored.verified for b in batches if b for e in b.entries)
    assert picks[VerifyMode.LAZY] == picks[VerifyMode.EAGER]
    assert picks[VerifyMode.LAZY]  # something was picked


def test_skipping_rejected_candidates_keeps_the_uniform_draw_over_the_good_ones() -> None:
    """Picking 2 of 4 good groups (one per peer) among 4 bad ones: each good group is in half the
    picks and each pair in a sixth, as when only the good ones are pooled."""
    good = [Entry(scored("external", f"good-{i}"), f"good-{i}", 0.0) for i in range(4)]
    bad = [Entry(scored("external", f"bad-{i}"), f"bad-{i}", 0.0) for i in range(4)]
    entries = [e for pair in zip(bad, good, strict=True) for e in pair]
    rng = random.Random(3)
    trials = 6000
    singles: Counter[str] = Counter()
    pairs: Counter[tuple[str, ...]] = Counter()
    for _ in range(trials):
        picked = pick_external(
            entries,
            2,
            1,
            SelectionPolicy.UNIFORM,
            rng,
            accept=lambda e: e if e.handle.startswith("good") else None,
        )
        handles = sorted(e.handle for e in picked)
        assert len(handles) == 2
        assert all(h.startswith("good") for h in handles)
        singles.update(handles)
        pairs[tuple(handles)] += 1
    assert all(singles[e.handle] / trials == pytest.approx(0.5, abs=0.03) for e in good)
    assert len(pairs) == 6
    assert all(n / trials == pytest.approx(1 / 6, abs=0.03) for n in pairs.values())
