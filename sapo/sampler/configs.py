"""The generator settings a node's own groups were sampled with, over a recent window.

Each group a node's generator publishes carries the fingerprint of the settings that decide its
content (`sapo-generator-config`, `sapo.generator.fingerprint`). The node's replicas share its work,
and after a failover two of them may publish the same group id: with other settings, other content
under one id. More than one fingerprint within the window therefore means replicas that differ:
expected while a rolling update runs old and new side by side, a fault when it lasts (the alert
SapoGeneratorConfigsDiverge waits the chart's `generatorConfigsDivergeFor`, 15 minutes by default).
Nothing is refused for it.

The window is `WINDOW_S` of the sampler's clock, from each fingerprint's latest group: a replica that
stopped (the old side of a finished rollout) leaves the count 5 minutes after its last group, so a
rollout 5 minutes shorter than the alert's wait (10 minutes at the default) passes without it. A
replica whose groups come further apart than the window (lock-step rounds slower than 5 minutes) is
counted only around its groups.
Memory is bounded: at most `MAX_CONFIGS` fingerprints are kept, the least recently seen goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, NamedTuple

WINDOW_S: Final = 300.0
MAX_CONFIGS: Final = 16
"""More than any rollout runs at once: the count only has to say "more than one"."""


class NewConfig(NamedTuple):
    """A fingerprint not seen within the window: `previous` is that of the group seen before it ("" for
    the first group), `configs` the fingerprints within the window, this one included."""

    config: str
    previous: str
    configs: int


class GeneratorConfigs:
    """Distinct fingerprints seen within `window_s`; see the module docstring."""

    def __init__(self, window_s: float = WINDOW_S, max_configs: int = MAX_CONFIGS) -> None:
        if window_s <= 0 or max_configs < 1:
            raise ValueError(f"need window_s > 0 and max_configs >= 1; got {window_s}, {max_configs}")
        self._window_s = window_s
        self._max = max_configs
        self._seen: OrderedDict[str, float] = OrderedDict()
        """Fingerprint -> when its latest group arrived, least recent first."""
        self._last = ""
        """The fingerprint of the group seen last, kept past the window to name what a change replaced."""

    def observe(self, config: str, now: float) -> NewConfig | None:
        """A group sampled with settings `config` arrived at `now`; what changed when it is new to the
        window (None too when it only comes back after a quiet spell: nothing changed)."""
        self._expire(now)
        new = config not in self._seen
        self._seen[config] = now
        self._seen.move_to_end(config)
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        previous, self._last = self._last, config
        return NewConfig(config, previous, len(self._seen)) if new and previous != config else None

    def count(self, now: float) -> int:
        """The fingerprints seen within the window before `now`."""
        self._expire(now)
        return len(self._seen)

    def _expire(self, now: float) -> None:
        horizon = now - self._window_s
        while self._seen and next(iter(self._seen.values())) < horizon:
            self._seen.popitem(last=False)
