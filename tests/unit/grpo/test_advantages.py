from __future__ import annotations

import math

import pytest

from sapo.grpo.advantages import group_advantages, has_signal

pytestmark = pytest.mark.unit


def test_binary_group_uses_sample_std() -> None:
    # mean 0.5; sample std = sqrt(4 * 0.25 / 3) = sqrt(1/3)
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0])
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert advantages == pytest.approx([expected, -expected, -expected, expected])


def test_signs_follow_reward_order() -> None:
    rewards = [0.2, 0.9, 0.5, 0.1]
    advantages = group_advantages(rewards)
    assert [a > 0 for a in advantages] == [False, True, True, False]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-12)
    assert sorted(range(4), key=lambda i: advantages[i]) == sorted(range(4), key=lambda i: rewards[i])


def test_scale_none_only_centres() -> None:
    assert group_advantages([3.0, 1.0], scale="none") == pytest.approx([1.0, -1.0])


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 1.0], [0.0] * 8, [0.1 + 0.2, 0.3, 0.3], [0.7]])
def test_constant_or_single_groups_carry_no_signal(rewards: list[float]) -> None:
    assert not has_signal(rewards)
    assert group_advantages(rewards) == [0.0] * len(rewards)


def test_any_difference_is_signal() -> None:
    assert has_signal([0.0, 0.0, 0.0, 0.125])


@pytest.mark.parametrize("rewards", [[], [1.0, math.nan], [math.inf, 0.0]])
def test_invalid_rewards_are_rejected(rewards: list[float]) -> None:
    with pytest.raises(ValueError, match="reward"):
        group_advantages(rewards)


def test_unknown_scale_is_rejected() -> None:
    with pytest.raises(ValueError, match="scale"):
        group_advantages([0.0, 1.0], scale="batch")  # type: ignore[arg-type]
