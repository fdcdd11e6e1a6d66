"""Lazy arrival on the facts header (`Screen.check_facts`): the same verdicts as screening the decoded
body, the same verified group once picked, and every lie the header can tell caught when the body is
decoded (`facts_mismatch`, dead-lettered), never trained on."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from sapo.identity import Sender
from sapo.sampler import (
    Scored,
    Screen,
    SeenGroups,
    Unread,
    VerifyMode,
    arrival_facts,
    header_reason,
    parse,
)
from sapo.tasks import QuestionRecord
from sapo.v1 import question_pb2, rollout_pb2
from sapo.wire import (
    H_FACTS,
    MAX_GROUP_COMPLETIONS,
    InvalidMessageError,
    encode_facts,
    group_facts,
    rollout_headers,
)
from tests.unit.sampler.builders import questions, real_group, screen_config

pytestmark = pytest.mark.unit

NODE = "node-0"
RECORDS = questions(node_seed=31, count=24)
T0 = time.time()
"""The clock these tests judge with: their groups are completed at it, not when a test runs (a run can
reach this module long after it was imported, and a group dated later would be `clock_ahead`)."""
Edit = Callable[[rollout_pb2.RolloutGroup], None]


def _group(record: QuestionRecord, node_id: str, *args: Any, **kwargs: Any) -> rollout_pb2.RolloutGroup:
    """`real_group`, completed at T0."""
    return real_group(record, node_id, *args, completed_s=T0, **kwargs)


def _screen(verify: VerifyMode = VerifyMode.LAZY, arrivals: list[tuple[str, int]] | None = None) -> Screen:
    cfg = screen_config(NODE, max_external_age_s=600.0, verify=verify)

    def arrived(node: str, _group_id: str, round_: int, _origin: str, _now: float) -> None:
        if arrivals is not None:
            arrivals.append((node, round_))

    return Screen(cfg, SeenGroups(1000), on_arrival=arrived)


def _unread(group: rollout_pb2.RolloutGroup, headers_of: rollout_pb2.RolloutGroup | None = None) -> Unread:
    """The record a generator publishes for `group`, its headers made from `headers_of` when given."""
    value = group.SerializeToString()
    headers = dict(rollout_headers(headers_of or group, value))
    facts = arrival_facts(headers, "external", _screen().cfg)
    assert facts is not None
    return Unread(value, headers, facts)


def _on_facts(screen: Screen, group: rollout_pb2.RolloutGroup, now: float = T0) -> Scored | str:
    return screen.check_facts(_unread(group), now, Sender(group.node_id))


def _decoded(screen: Screen, group: rollout_pb2.RolloutGroup, now: float = T0) -> Scored | str:
    unread = _unread(group)
    return screen.check(
        parse(unread.value, 1 << 20, unread.headers), "external", now, 0, Sender(group.node_id)
    )


def _set(path: str, value: object) -> Edit:
    def edit(group: rollout_pb2.RolloutGroup) -> None:
        *parents, name = path.split(".")
        target = group
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, name, value)

    return edit


def _no_claim(group: rollout_pb2.RolloutGroup) -> None:
    group.completions[0].reward = 0.0
    group.completions[3].reward = 0.0


def _claims_nothing(group: rollout_pb2.RolloutGroup) -> None:
    for completion in group.completions:
        completion.reward = 0.0


def _errors(group: rollout_pb2.RolloutGroup) -> None:
    for completion in group.completions[1:]:
        completion.finish_reason = rollout_pb2.FINISH_REASON_ERROR


def _tampered(group: rollout_pb2.RolloutGroup) -> None:
    group.question.answer += "0"


CASES: dict[str, tuple[Edit | None, str | None]] = {
    "honest": (None, None),
    "own node": (_set("node_id", NODE), "own_node"),
    "foreign config": (_set("question.provenance.config_digest", "0" * 64), "config_not_accepted"),
    "too old": (_set("completed_at.seconds", int(T0) - 3600), "too_old"),
    "never completed": (lambda g: g.ClearField("completed_at"), "too_old"),
    "clock 2 min ahead": (_set("completed_at.seconds", int(T0) + 120), None),
    "clock 2 h ahead": (_set("completed_at.seconds", int(T0) + 7200), "clock_ahead"),
    "eval split": (_set("question.provenance.split", question_pb2.SPLIT_EVAL), "not_train_split"),
    "claims no signal": (_no_claim, "no_signal_claimed"),
    "one scored completion": (_errors, "too_few_completions"),
    "tampered": (_tampered, None),  # pooled on both paths: only verification can tell
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_facts_arrival_gives_the_decoded_arrival_verdict_and_the_same_verified_group(case: str) -> None:
    edit, reason = CASES[case]
    group = _group(RECORDS[sorted(CASES).index(case)], "peer-1")
    if edit is not None:
        edit(group)
    on_facts, decoded = _on_facts(_screen(), group), _decoded(_screen(), group)
    if reason is not None:
        assert on_facts == decoded == reason
        return
    assert isinstance(on_facts, Scored) and isinstance(decoded, Scored)
    assert not on_facts.verified and on_facts.unread is not None
    assert (on_facts.group_id, on_facts.peer, on_facts.round) == (
        decoded.group_id,
        decoded.peer,
        decoded.round,
    )
    assert on_facts.completed_s == decoded.completed_s
    try:
        verified = _screen().verify(on_facts)
    except InvalidMessageError as exc:
        with pytest.raises(InvalidMessageError) as info:
            _screen().verify(decoded)
        assert exc.reason == info.value.reason == "answer_mismatch"
        return
    assert verified == _screen().verify(decoded)


def test_unset_split_and_oversized_bodies_are_dead_lettered_on_arrival() -> None:
    unset = _group(RECORDS[0], "peer-1")
    unset.question.provenance.ClearField("split")
    with pytest.raises(InvalidMessageError, match="missing_split"):
        _on_facts(_screen(), unset)
    small = dataclasses.replace(_screen().cfg, max_payload_bytes=100)
    with pytest.raises(InvalidMessageError, match="oversized"):
        Screen(small, SeenGroups(10)).check_facts(_unread(_group(RECORDS[1], "peer-1")), T0, Sender("peer-1"))


def test_duplicates_and_lockstep_arrivals_key_on_the_headers_facts() -> None:
    arrivals: list[tuple[str, int]] = []
    screen = _screen(arrivals=arrivals)
    group = _group(RECORDS[2], "peer-1", round_=7)
    first = _on_facts(screen, group)
    assert isinstance(first, Scored)
    assert (first.group.node_id, first.group.round, first.group.group_id) == ("peer-1", 7, group.group_id)
    screen.seen.add(first.group_id)
    assert _on_facts(screen, group) == "duplicate"
    assert arrivals == [("peer-1", 7), ("peer-1", 7)]  # as check: a duplicate is still an arrival
    assert _on_facts(screen, _group(RECORDS[3], NODE)) == "own_node"
    assert len(arrivals) == 2  # not a peer's arrival


def _lie(edit: Edit) -> Unread:
    """A record whose body is a real group and whose facts header describes `edit` of it."""
    body = _group(RECORDS[4], "peer-1", (True, False, False))
    claimed = rollout_pb2.RolloutGroup()
    claimed.CopyFrom(body)
    edit(claimed)
    return _unread(body, headers_of=claimed)


LIES: dict[str, Edit] = {
    "group id": _set("group_id", "3f1e0000-0000-4000-8000-000000000000"),
    "round": _set("round", 3),
    "completed at": _set("completed_at.nanos", 1),
    "config digest": _set("question.provenance.config_digest", "1" * 64),
    "split": _set("question.provenance.split", question_pb2.SPLIT_EVAL),
    "signal": _claims_nothing,
    "scored": lambda g: g.completions.add().CopyFrom(g.completions[0]),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_facts_header_that_lies_is_caught_when_the_body_is_decoded(lie: str) -> None:
    unread = _lie(LIES[lie])
    assert unread.facts != group_facts(parse(unread.value, 1 << 20))
    pooled = _screen().check_facts(unread, T0, Sender("peer-1"))
    if not isinstance(pooled, Scored):  # the lie only cost its sender the group
        assert pooled in ("not_train_split", "no_signal_claimed", "config_not_accepted")
        return
    with pytest.raises(InvalidMessageError) as info:
        _screen().verify(pooled)
    assert info.value.reason == "facts_mismatch"
    with pytest.raises(InvalidMessageError, match="facts_mismatch"):  # eager decoding checks them too
        parse(unread.value, 1 << 20, unread.headers)


def test_a_body_of_another_node_than_its_sender_is_an_identity_mismatch_when_picked() -> None:
    group = _group(RECORDS[5], "peer-2")
    pooled = _screen().check_facts(_unread(group), T0, Sender("peer-1"))
    assert isinstance(pooled, Scored) and pooled.peer == "peer-1"
    with pytest.raises(InvalidMessageError, match="identity_mismatch"):
        _screen().verify(pooled)


def test_which_records_arrive_on_their_facts() -> None:
    group = _group(RECORDS[6], "peer-1")
    headers = dict(rollout_headers(group, group.SerializeToString()))
    lazy, eager = _screen().cfg, _screen(VerifyMode.EAGER).cfg
    assert arrival_facts(headers, "external", lazy) == group_facts(group)
    assert arrival_facts(headers, "local", lazy) is None  # the node's own groups: verified on arrival
    assert arrival_facts(headers, "external", eager) is None
    assert arrival_facts({k: v for k, v in headers.items() if k != H_FACTS}, "external", lazy) is None
    assert arrival_facts(headers | {H_FACTS: b"f9;anything"}, "external", lazy) is None  # a later version
    fields = encode_facts(group_facts(group)).split(b";")
    malformed = b";".join([*fields[:2], b"x", *fields[3:]])  # the round is no integer
    with pytest.raises(InvalidMessageError, match="facts_mismatch"):
        arrival_facts(headers | {H_FACTS: malformed}, "external", lazy)


def test_a_generator_config_header_changes_no_verdict() -> None:
    """The header a node's generator adds for its own sampler: the prefilter, the facts arrival and the
    decoded path read past it."""
    group = _group(RECORDS[8], "peer-1")
    value = group.SerializeToString()
    headers = dict(rollout_headers(group, value, generator_config="0123456789abcdef"))
    lazy = _screen().cfg
    assert header_reason(headers, "external", lazy) is None
    facts = arrival_facts(headers, "external", lazy)
    assert facts is not None and facts == group_facts(group)
    assert isinstance(_screen().check_facts(Unread(value, headers, facts), T0, Sender("peer-1")), Scored)
    decoded = parse(value, 1 << 20, headers)
    assert isinstance(_screen(VerifyMode.EAGER).check(decoded, "external", T0, 0, Sender("peer-1")), Scored)


def test_a_group_of_too_many_completions_is_refused_on_its_facts_and_on_its_body() -> None:
    """Each completion of a picked group is re-scored, and trained as a row: a peer's group of
    thousands of tiny completions is refused before any of that, on arrival."""
    group = _group(RECORDS[7], "peer-1")
    while len(group.completions) <= MAX_GROUP_COMPLETIONS:
        group.completions.add().CopyFrom(group.completions[len(group.completions) % 4])
    with pytest.raises(InvalidMessageError) as lazy:
        _on_facts(_screen(), group)
    assert lazy.value.reason == "too_many_completions"
    with pytest.raises(InvalidMessageError) as eager:
        _decoded(_screen(VerifyMode.EAGER), group)
    assert eager.value.reason == "too_many_completions"
