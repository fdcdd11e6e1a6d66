"""Round pacing: which policy version a round may be generated with (docs/architecture.md, round modes).

Policy version v is the trainer's step count, and the trainer takes one step per round. So:

- `lockstep` (the paper): round r is generated with exactly version r. Round 0 uses the initial
  weights; round r > 0 waits until version r is loaded. If a newer version is already loaded (this
  generator restarted, or fell behind), the round counter jumps to it: generating an old round with a
  newer policy would hand the sampler data for a round the trainer has left behind.
- `async`: round r may run at most `max_ahead` versions ahead of the loaded policy, i.e. it needs
  version >= r - max_ahead (bounded staleness k = max_ahead). Generation never jumps rounds.

A generator starts at the latest *announced* version (not the loaded one: a version that failed to load
must still be waited out, never generated past), so a restart continues where the node is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PacingMode(StrEnum):
    LOCKSTEP = "lockstep"
    ASYNC = "async"


@dataclass(frozen=True)
class Pacing:
    """The pacing rules of one generator: mode, staleness bound (async only) and optional round limit."""

    mode: PacingMode
    max_ahead: int = 0
    rounds: int = 0
    """Stop before generating this round number; 0 = run forever."""

    def __post_init__(self) -> None:
        if self.max_ahead < 0 or self.rounds < 0:
            raise ValueError(f"max_ahead and rounds must be >= 0, got {self.max_ahead}, {self.rounds}")
        if self.mode is PacingMode.LOCKSTEP and self.max_ahead:
            raise ValueError("max_ahead applies to async mode only; lockstep runs exactly 0 ahead")

    def required_version(self, round_: int) -> int:
        """Lowest loaded policy version round `round_` may be generated with."""
        return max(0, round_ - self.max_ahead)

    def align(self, round_: int, loaded_version: int) -> int:
        """The round to generate next: in lockstep never behind the loaded policy; async unchanged."""
        return max(round_, loaded_version) if self.mode is PacingMode.LOCKSTEP else round_

    def may_generate(self, round_: int, loaded_version: int) -> bool:
        return loaded_version >= self.required_version(round_)

    def finished(self, round_: int) -> bool:
        """True once the round limit (if any) is reached."""
        return self.rounds > 0 and round_ >= self.rounds
