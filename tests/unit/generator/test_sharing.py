"""Sharing policies: what reaches the swarm topic, and that `fraction` is reproducible per group."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sapo.generator import SharingPolicy, should_share
from sapo.v1 import rollout_pb2
from tests.factories import make_group

pytestmark = pytest.mark.unit


def _group(
    rewards: Sequence[float], failed: int = 0, index: int = 3, round_: int = 0
) -> rollout_pb2.RolloutGroup:
    group = make_group(rewards=rewards)
    group.round = round_
    group.question.provenance.index = index
    for _ in range(failed):
        group.completions.add(finish_reason=rollout_pb2.FINISH_REASON_ERROR, error="boom")
    return group


@pytest.mark.parametrize(
    ("policy", "rewards", "expected"),
    [
        (SharingPolicy.ALL, (0.0, 0.0), True),
        (SharingPolicy.NONE, (1.0, 0.0), False),
        (SharingPolicy.VARIANCE, (1.0, 0.0, 0.0), True),
        (SharingPolicy.VARIANCE, (0.25, 0.25, 0.25), False),
        (SharingPolicy.VARIANCE, (1.0,), False),
    ],
)
def test_policies(policy: SharingPolicy, rewards: Sequence[float], expected: bool) -> None:
    assert should_share(_group(rewards), policy) is expected


def test_a_group_of_only_failed_completions_is_never_shared() -> None:
    group = _group((), failed=3)
    assert not any(should_share(group, policy, fraction=1.0) for policy in SharingPolicy)


def test_variance_ignores_failed_completions() -> None:
    # One scored reward plus failures: there is nothing to compare it with.
    assert not should_share(_group((1.0,), failed=2), SharingPolicy.VARIANCE)


def test_fraction_is_deterministic_per_group_and_close_to_the_fraction() -> None:
    groups = [_group((1.0, 0.0), index=i, round_=i % 7) for i in range(2000)]
    first = [should_share(g, SharingPolicy.FRACTION, fraction=0.3, seed=5) for g in groups]
    again = [should_share(g, SharingPolicy.FRACTION, fraction=0.3, seed=5) for g in groups]
    other_seed = [should_share(g, SharingPolicy.FRACTION, fraction=0.3, seed=6) for g in groups]
    assert first == again  # a regenerated round shares the same questions
    assert first != other_seed
    assert 0.26 < sum(first) / len(first) < 0.34
    assert all(should_share(g, SharingPolicy.FRACTION, fraction=1.0) for g in groups[:50])
    assert not any(should_share(g, SharingPolicy.FRACTION, fraction=0.0) for g in groups[:50])


def test_fraction_depends_on_the_question_not_the_group_id() -> None:
    # A regenerated round gets new group ids; the same questions must still be shared.
    for index in range(40):
        a, b = _group((1.0, 0.0), index=index), _group((1.0, 0.0), index=index)
        assert a.group_id != b.group_id
        assert should_share(a, SharingPolicy.FRACTION, fraction=0.5, seed=9) == should_share(
            b, SharingPolicy.FRACTION, fraction=0.5, seed=9
        )
