"""The paired interval: the effect is the mean difference; the bootstrap respects seeds and round blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sapo.experiment.stats import paired_interval


def test_a_constant_difference_has_a_zero_width_interval_and_a_verdict() -> None:
    better = paired_interval([[0.05] * 20, [0.05] * 20])
    assert (better.effect, better.low, better.high, better.n, better.seeds) == pytest.approx(
        (0.05, 0.05, 0.05, 40, 2)
    )
    assert better.verdict == "better"
    assert paired_interval([[-0.01] * 10]).verdict == "worse"
    assert paired_interval([]).verdict == "not enough data"
    assert paired_interval([[math.nan, 0.2]]).effect == pytest.approx(0.2)


def test_intervals_of_pure_noise_cover_zero_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(1)
    found = [
        paired_interval([list(rng.normal(0.0, 0.02, 40)) for _ in range(3)], draws=300) for _ in range(60)
    ]
    covered = sum(i.verdict == "no measurable difference" for i in found) / len(found)
    assert 0.85 <= covered <= 1.0
    assert found[0].cell().startswith(f"{found[0].effect:+.3f} [")


def test_seeds_are_the_replicates_not_rounds() -> None:
    """Three seeds that all fall a little below 0 with tight rounds (the committed CPU experiment's 4/4
    against 8/0): rounds alone look precise, but three seeds are three observations, and the interval
    is a t interval over them: t(0.975, 2) = 4.303."""
    found = paired_interval([[-0.006] * 20, [-0.003] * 20, [-0.009] * 20])
    assert found.effect == pytest.approx(-0.006)
    assert found.high - found.effect == pytest.approx(4.303 * 0.003 / 3**0.5, rel=1e-3)
    assert found.verdict == "no measurable difference"
    assert (found.n, found.seeds) == (60, 3)


def test_persistent_differences_are_not_treated_as_independent_rounds() -> None:
    """One run whose difference drifts (a policy that diverged stays diverged): blocks of rounds give
    a wider interval than resampling single rounds would."""
    drift = list(np.repeat([0.04, -0.02, 0.03, -0.01, 0.02, 0.0], 10))
    blocks = paired_interval([drift], block=5)
    single = paired_interval([drift], block=1)
    assert blocks.high - blocks.low > single.high - single.low


def test_a_short_run_is_not_one_block() -> None:
    """Three rounds of one seed, the first identical in both configurations: no verdict from them."""
    found = paired_interval([[0.0, 0.004, 0.005]])
    assert found.low <= 0.0 < found.high
    assert found.verdict == "no measurable difference"
