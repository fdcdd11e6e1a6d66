"""Each filter of the pipeline on real groups: header prefilter, bounded decode, identity, freshness,
dedupe, re-derivation, local re-scoring, the signal filter."""

from __future__ import annotations

import json
import time

import pytest

from sapo.convert import question_to_proto
from sapo.grpo.advantages import group_advantages
from sapo.sampler import REASONS, Scored, Screen, ScreenConfig, SeenGroups, header_reason, parse
from sapo.sampler.screen import ArrivalHook, VerifyMode
from sapo.sampler.settings import SamplerSettings
from sapo.sampler.verifier import Verifier
from sapo.tasks import QuestionRecord
from sapo.tasks.records import canonical_json, sha256_hex
from sapo.v1 import rollout_pb2
from sapo.wire import H_NODE, H_SCHEMA, H_TASK, InvalidMessageError
from tests.unit.sampler.builders import WRONG, encoded, honest, questions, real_group, right, screen_config

pytestmark = pytest.mark.unit

NODE = "node-0"


def _cfg(**overrides: object) -> ScreenConfig:
    base: dict[str, object] = {"max_payload_bytes": 1 << 20, "max_external_age_s": 600.0, "max_policy_lag": 2}
    return screen_config(NODE, **(base | overrides))


def _screen(on_arrival: ArrivalHook | None = None, **overrides: object) -> Screen:
    return Screen(_cfg(**overrides), SeenGroups(1000), on_arrival=on_arrival)


RECORDS = questions(node_seed=11, count=6)


def test_every_reason_is_listed_once() -> None:
    assert len(REASONS) == len(set(REASONS))
    assert {"own_node", "answer_mismatch", "no_signal", "duplicate", "oversized", "unused"} <= set(REASONS)


def test_header_prefilter() -> None:
    group = real_group(RECORDS[0], "peer-1")
    _, headers = encoded(group)
    hdrs = dict(headers)
    assert header_reason(hdrs, "external", _cfg()) is None
    assert header_reason(hdrs | {H_NODE: NODE.encode()}, "external", _cfg()) == "own_node"
    # The node's own stream carries only its own groups: the own-node rule does not apply there.
    assert header_reason(hdrs | {H_NODE: NODE.encode()}, "local", _cfg()) is None
    only_other = _cfg(accepted_tasks=frozenset({"some_other_task"}))
    assert header_reason(hdrs, "external", only_other) == "task_not_accepted"
    assert header_reason(hdrs | {H_SCHEMA: b"2"}, "external", _cfg()) == "schema_version"
    # Missing routing headers never reject: the decoded body decides.
    assert header_reason({}, "external", _cfg()) is None
    assert {H_TASK, H_NODE} <= hdrs.keys()


def test_parse_bounds_and_validates() -> None:
    group = real_group(RECORDS[0], "peer-1")
    assert parse(group.SerializeToString(), 1 << 20) == group
    with pytest.raises(InvalidMessageError) as big:
        parse(b"x" * 2048, 1024)
    assert big.value.reason == "oversized"
    with pytest.raises(InvalidMessageError) as junk:
        parse(b"\xff\xff\xff", 1024)
    assert junk.value.reason == "undecodable"
    group.group_id = "not-a-uuid"
    with pytest.raises(InvalidMessageError) as bad:
        parse(group.SerializeToString(), 1 << 20)
    assert bad.value.reason == "bad_group_id"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_parse_refuses_nonfinite_logprobs_and_keeps_extreme_finite_ones(bad: float) -> None:
    group = real_group(RECORDS[0], "peer-1")
    for comp in group.completions:
        comp.logprobs.extend([-3.4e38] * len(comp.token_ids))  # the most negative float32: finite
    assert parse(group.SerializeToString(), 1 << 20) == group
    group.completions[-1].logprobs[1] = bad
    with pytest.raises(InvalidMessageError) as info:
        parse(group.SerializeToString(), 1 << 20)
    assert info.value.reason == "nonfinite_logprob"


def test_rewards_are_recomputed_never_taken_from_the_sender() -> None:
    record = RECORDS[1]
    group = real_group(record, "peer-1", (True, False, False, True))
    group.completions[1].reward = 1.0  # forged: the text is wrong
    verdict = honest(_screen(), group, "external", time.time(), 0)
    assert isinstance(verdict, Scored)
    assert verdict.rewards[0] == verdict.rewards[3] == 1.0
    assert verdict.rewards[1] == verdict.rewards[2] < 1.0
    assert list(verdict.advantages) == pytest.approx(group_advantages(list(verdict.rewards)))


def test_error_completions_are_dropped_not_scored() -> None:
    group = real_group(RECORDS[0], "peer-1", (True, False, True, False))
    group.completions[0].finish_reason = rollout_pb2.FINISH_REASON_ERROR
    verdict = honest(_screen(), group, "external", time.time(), 0)
    assert isinstance(verdict, Scored)
    assert len(verdict.group.completions) == len(verdict.rewards) == 3
    assert [c.text for c in verdict.group.completions] == [WRONG, right(RECORDS[0]), WRONG]
    for i in (1, 2, 3):
        group.completions[i].finish_reason = rollout_pb2.FINISH_REASON_ERROR
    assert honest(_screen(), group, "external", time.time(), 0) == "too_few_completions"


def test_zero_advantage_groups_are_dropped() -> None:
    all_right = real_group(RECORDS[0], "peer-1", (True, True, True))
    assert honest(_screen(), all_right, "external", time.time(), 0) == "no_signal"
    assert (
        honest(_screen(), real_group(RECORDS[0], NODE, (True, True)), "local", time.time(), 0) == "no_signal"
    )


def test_the_reference_baseline_keeps_own_zero_advantage_groups_and_filters_the_swarms() -> None:
    screen = _screen(keep_local_zero_advantage=True)
    own = honest(screen, real_group(RECORDS[0], NODE, (True, True, True)), "local", time.time(), 0)
    assert isinstance(own, Scored)
    assert own.rewards == (1.0, 1.0, 1.0) and own.advantages == (0.0, 0.0, 0.0)
    peer = real_group(RECORDS[1], "peer-1", (False, False, False))
    assert honest(screen, peer, "external", time.time(), 0) == "no_signal"


@pytest.mark.parametrize(
    ("field", "reason"),
    [("answer", "answer_mismatch"), ("text", "question_mismatch")],
)
def test_tampered_questions_are_unverifiable(field: str, reason: str) -> None:
    group = real_group(RECORDS[2], "peer-1")
    setattr(group.question, field, getattr(group.question, field) + " 1")
    with pytest.raises(InvalidMessageError) as info:
        honest(_screen(), group, "external", time.time(), 0)
    assert info.value.reason == reason


def test_eval_questions_are_not_trained_on() -> None:
    eval_record = questions(node_seed=11, count=1, split="eval")[0]
    group = real_group(eval_record, "peer-1")
    assert honest(_screen(), group, "external", time.time(), 0) == "not_train_split"
    # An eval item passed off as a training one fails re-derivation.
    group.question.provenance.split = question_to_proto(RECORDS[0]).provenance.split
    with pytest.raises(InvalidMessageError) as info:
        honest(_screen(), group, "external", time.time(), 0)
    assert info.value.reason == "split_mismatch"


def test_freshness_bounds() -> None:
    now = time.time()
    screen = _screen()
    old = real_group(RECORDS[0], "peer-1", completed_s=now - 601)
    assert honest(screen, old, "external", now, 0) == "too_old"
    unset = real_group(RECORDS[0], "peer-1")
    unset.ClearField("completed_at")
    assert honest(screen, unset, "external", now, 0) == "too_old"
    # Local: policy versions behind the batch it would join; a peer's version means nothing to us.
    lagging = real_group(RECORDS[0], NODE, policy_version=3)
    assert honest(screen, lagging, "local", now, 6) == "stale"
    assert isinstance(honest(screen, lagging, "local", now, 5), Scored)
    assert isinstance(honest(screen, real_group(RECORDS[0], "peer-1"), "external", now, 99), Scored)


@pytest.mark.parametrize(
    ("skew_s", "verdict"),
    [
        (-120.0, None),  # a peer's clock 2 min behind: its groups look 2 min older
        (120.0, None),  # 2 min ahead: within the tolerated skew
        (-600.0, None),
        (600.0, "clock_ahead"),
        (-7200.0, "too_old"),
        (7200.0, "clock_ahead"),
    ],
)
def test_a_peer_clock_skewed_a_few_minutes_is_tolerated_and_a_date_far_ahead_refused(
    skew_s: float, verdict: str | None
) -> None:
    """The default bounds (900 s of age, 300 s of skew ahead): a group just completed by a peer whose
    clock is off by `skew_s`. A date far ahead would keep the group fresh, pooled and replayable for
    as long as it is ahead."""
    now = time.time()
    screen = _screen(max_external_age_s=SamplerSettings(node_id=NODE).max_external_age_s)
    group = real_group(RECORDS[0], "peer-1", completed_s=now + skew_s)
    result = honest(screen, group, "external", now, 0)
    if verdict is None:
        assert isinstance(result, Scored), result
    else:
        assert result == verdict


def test_identity_is_checked_on_the_decoded_body_and_dedupe_by_group_id() -> None:
    screen = _screen(accepted_tasks=frozenset({RECORDS[0].task}))
    mine = real_group(RECORDS[0], NODE)
    assert honest(screen, mine, "external", time.time(), 0) == "own_node"
    other_task = next(r for r in RECORDS if r.task != RECORDS[0].task)
    assert honest(screen, real_group(other_task, "peer-1"), "external", time.time(), 0) == "task_not_accepted"
    group = real_group(RECORDS[0], "peer-1")
    assert isinstance(honest(screen, group, "external", time.time(), 0), Scored)
    screen.seen.add(group.group_id)
    assert honest(screen, group, "external", time.time(), 0) == "duplicate"


def test_arrivals_are_reported_before_freshness_and_signal_filters() -> None:
    arrivals: list[tuple[str, str]] = []
    screen = _screen(on_arrival=lambda node, _id, _round, origin, _now: arrivals.append((node, origin)))
    honest(screen, real_group(RECORDS[0], NODE), "local", time.time(), 0)
    honest(screen, real_group(RECORDS[0], "peer-1", (True, True)), "external", time.time(), 0)  # no signal
    honest(screen, real_group(RECORDS[0], NODE), "external", time.time(), 0)  # own node: not an arrival
    assert arrivals == [(NODE, "local"), ("peer-1", "external")]


def test_own_groups_of_a_refused_task_still_arrive_so_lockstep_rounds_close() -> None:
    """accepted_tasks narrows what a node trains on; its own round still has questions_per_round
    groups, and lock-step waits for all of them (a refused one used to stall the round)."""
    arrivals: list[tuple[str, str]] = []
    other_task = next(r for r in RECORDS if r.task != RECORDS[0].task)
    screen = _screen(
        accepted_tasks=frozenset({RECORDS[0].task}),
        on_arrival=lambda node, _id, _round, origin, _now: arrivals.append((node, origin)),
    )
    assert honest(screen, real_group(other_task, NODE), "local", time.time(), 0) == "task_not_accepted"
    assert honest(screen, real_group(other_task, "peer-1"), "external", time.time(), 0) == "task_not_accepted"
    assert arrivals == [(NODE, "local")]
    cfg = screen.cfg
    headers = {H_TASK: other_task.task.encode(), H_NODE: NODE.encode()}
    assert header_reason(headers, "local", cfg) is None  # decoded, so it can be counted
    peer_headers = {H_TASK: other_task.task.encode(), H_NODE: b"peer-1"}
    assert header_reason(peer_headers, "external", cfg) == "task_not_accepted"


def _with_config(original: rollout_pb2.RolloutGroup, config: dict[str, object]) -> rollout_pb2.RolloutGroup:
    """The group with its provenance pointing at another, self-consistent dataset configuration."""
    group = rollout_pb2.RolloutGroup()
    group.CopyFrom(original)
    provenance = group.question.provenance
    provenance.config_json = canonical_json(config)
    provenance.config_digest = sha256_hex(provenance.config_json)
    return group


class _CountingVerifier(Verifier):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def verify(self, record: QuestionRecord) -> str | None:
        self.calls += 1
        return super().verify(record)


@pytest.mark.parametrize("verify", [VerifyMode.EAGER, VerifyMode.LAZY])
def test_a_peer_config_outside_the_accepted_profiles_is_refused_before_any_rederivation(
    verify: VerifyMode,
) -> None:
    """A self-consistent provenance (its digest matches its config) naming a configuration no accepted
    profile has: re-deriving it would cost whatever the peer chose. Refused by reason and never
    generated, in either verify mode; the same configuration allow-listed by digest is re-derived (and
    here refused by what re-derivation finds)."""
    honest_group = real_group(RECORDS[0], "peer-1")
    config = json.loads(honest_group.question.provenance.config_json) | {"size_of_everything": 10**9}
    foreign = _with_config(honest_group, config)
    verifier = _CountingVerifier()
    screen = Screen(_cfg(verify=verify), SeenGroups(1000), verifier=verifier)
    assert honest(screen, foreign, "external", time.time(), 0) == "config_not_accepted"
    assert verifier.calls == 0
    assert isinstance(honest(screen, honest_group, "external", time.time(), 0), Scored)

    allowed = _cfg(accepted_configs=screen.cfg.accepted_configs | {foreign.question.provenance.config_digest})
    with pytest.raises(InvalidMessageError) as rederived:
        honest(Screen(allowed, SeenGroups(1000)), foreign, "external", time.time(), 0)
    assert rederived.value.reason == "invalid_config"


def test_own_groups_are_not_held_to_the_accepted_configs() -> None:
    """The node's own generator draws from its own profile; the allow-list guards peers' provenance."""
    screen = _screen(accepted_configs=frozenset())
    assert isinstance(honest(screen, real_group(RECORDS[0], NODE), "local", time.time(), 0), Scored)
    peer = real_group(RECORDS[0], "peer-1")
    assert honest(screen, peer, "external", time.time(), 0) == "config_not_accepted"
