"""Paired differences between two configurations and their 95% intervals.

What is paired. All configurations of one seed start from the same weights and give every node the same
question stream and sampling seed, so configuration A and configuration B can be compared seed by seed
and round by round: d[s][r] = value_A(s, r) - value_B(s, r). The value of a round is the mean over the
nodes (of the swarm, or of one node group): the nodes of a sharing swarm train on each other's groups,
so they are not independent samples, and averaging them first treats A and B alike. The effect is the
mean of d over the rounds both runs have, averaged over seeds: "per node-round".

The interval. Consecutive rounds of one run are not independent: the policy of round r + 1 is the
policy of round r plus one step, so a difference that opens up persists, and a 60-round run is not 60
observations. Seeds are the independent replicates. So:
- two seeds or more: a Student t interval over the per-seed mean differences (n = seeds, n - 1 degrees
  of freedom). It is wide with few seeds, as it should be: a percentile bootstrap over 3 seeds cannot
  produce a mean outside the 3 seeds' range and was measured to be too narrow (on the committed CPU
  experiment it called 4/4 "worse" from 3 seeds that all happened to fall below 0).
- one seed: a moving-block bootstrap over the run's rounds (blocks of BLOCK_ROUNDS consecutive rounds,
  or a quarter of the run when it is shorter than 20 rounds; DRAWS draws, percentile interval, fixed
  RNG seed so a report is reproducible). It covers the round-to-round noise of that one run only, not
  how another seed would have gone: reports say so.

Held-out rewards are paired question by question (every policy answers the same eval questions with the
same sampling seed): per seed the mean over questions, then the same rule (one seed: questions are
resampled, blocks of 1, since they are drawn independently).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.stats import t as student_t

BLOCK_ROUNDS = 5
"""Rounds per bootstrap block: the smoothing window of the curves; much shorter than a run."""
DRAWS = 2000
RNG_SEED = 20250916
Verdict = Literal["better", "worse", "no measurable difference", "not enough data"]


@dataclass(frozen=True)
class Interval:
    """A paired effect (mean difference) and its 95% bootstrap interval; n = cells, seeds = clusters."""

    effect: float
    low: float
    high: float
    n: int
    seeds: int

    @property
    def verdict(self) -> Verdict:
        if self.n == 0 or not math.isfinite(self.low):
            return "not enough data"
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "no measurable difference"

    def cell(self, digits: int = 3) -> str:
        if self.n == 0:
            return "-"
        return f"{self.effect:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "effect": self.effect,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "seeds": self.seeds,
            "verdict": self.verdict,
        }


def _block_sample(values: np.ndarray, block: int, rng: np.random.Generator) -> np.ndarray:
    """Moving-block resample of one series to its own length. Blocks are at most a quarter of the
    series: a block as long as the run would resample nothing and give a zero-width interval."""
    n = len(values)
    size = max(1, min(block, n // 4))
    starts = rng.integers(0, n - size + 1, size=math.ceil(n / size))
    index = (starts[:, None] + np.arange(size)[None, :]).ravel()[:n]
    sample: np.ndarray = values[index]
    return sample


def paired_interval(
    clusters: Sequence[Sequence[float]], *, block: int = BLOCK_ROUNDS, draws: int = DRAWS
) -> Interval:
    """Mean of every value of every cluster (a seed's per-round or per-question differences) and its
    95% interval: Student t over the cluster means with two clusters or more, else a moving-block
    bootstrap of `block` consecutive values (module docstring). Non-finite values are dropped."""
    arrays = [a[np.isfinite(a)] for a in (np.asarray(c, dtype=float) for c in clusters)]
    arrays = [a for a in arrays if len(a)]
    n = sum(len(a) for a in arrays)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, 0)
    effect = float(np.concatenate(arrays).mean())
    if len(arrays) > 1:
        means = np.array([a.mean() for a in arrays])
        half = float(student_t.ppf(0.975, len(means) - 1)) * float(means.std(ddof=1)) / math.sqrt(len(means))
        centre = float(means.mean())  # seeds weigh equally, whatever their rounds
        return Interval(centre, centre - half, centre + half, n, len(arrays))
    rng = np.random.default_rng(RNG_SEED)
    resampled = np.array([_block_sample(arrays[0], block, rng).mean() for _ in range(draws)])
    low, high = np.quantile(resampled, [0.025, 0.975])
    return Interval(effect, float(low), float(high), n, 1)
