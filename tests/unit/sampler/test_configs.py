"""The window of generator settings fingerprints: what counts, what is reported new, what it forgets."""

from __future__ import annotations

import pytest

from sapo.sampler.configs import MAX_CONFIGS, WINDOW_S, GeneratorConfigs, NewConfig

pytestmark = pytest.mark.unit

A, B, C = "a" * 16, "b" * 16, "c" * 16


def test_replicas_that_differ_count_two_and_each_change_is_reported_once() -> None:
    configs = GeneratorConfigs()
    assert configs.observe(A, 0.0) == NewConfig(A, "", 1)
    assert configs.observe(A, 1.0) is None
    assert configs.observe(B, 2.0) == NewConfig(B, A, 2)
    for t in range(3, 10):  # the two replicas take turns: nothing new
        assert configs.observe((A, B)[t % 2], float(t)) is None
    assert configs.count(10.0) == 2


def test_a_fingerprint_leaves_the_window_after_its_last_group() -> None:
    """The old side of a finished rollout stops counting; the new side is no change when it comes back
    from a quiet spell, and a third fingerprint names the one seen last."""
    configs = GeneratorConfigs()
    configs.observe(A, 0.0)
    configs.observe(B, 60.0)
    assert configs.count(WINDOW_S - 1) == 2
    assert configs.count(WINDOW_S + 1) == 1  # A's last group is older than the window
    assert configs.count(60.0 + WINDOW_S + 1) == 0
    assert configs.observe(B, 1000.0) is None  # back after a quiet spell: the same settings
    assert configs.observe(C, 1001.0) == NewConfig(C, B, 2)


def test_memory_is_bounded() -> None:
    configs = GeneratorConfigs(window_s=10.0, max_configs=MAX_CONFIGS)
    for i in range(3 * MAX_CONFIGS):
        configs.observe(f"{i:016x}", 1.0)
    assert configs.count(1.0) == MAX_CONFIGS
    with pytest.raises(ValueError, match="max_configs"):
        GeneratorConfigs(max_configs=0)
