"""When a generator retries loading a policy version, and when it gives up.

A version can fail to load for a while and then succeed: its manifest or a shard is not visible yet
(an NFS client's attribute cache, a replica of an object store, a store that did not answer). Those
failures are transient and retried with bounded exponential backoff: `initial_s`, doubling up to
`max_s` between attempts, for at most `give_up_s` after the first failure. A digest mismatch, a
malformed file or weights that do not fit the model are permanent: checkpoints are immutable, so the
same bytes would fail again; such a version is rejected once and only a newer announcement can fix it.
Either way the generator keeps its old weights. It is not ready while an announced version newer than
its weights is still being loaded or retried, or while its work waits for an announced version that
did not load; past `max_behind_s` of that it is not live either (a generator that cannot load the
version it waits for must be restarted, not left waiting behind a green probe). A rejected or given-up
version that no work waits for (a bogus announcement far ahead) is counted and alerted on, and leaves
the generator ready.
"""

from __future__ import annotations

from dataclasses import dataclass

from sapo.storage import TRANSIENT


@dataclass(frozen=True)
class ReloadPolicy:
    initial_s: float
    max_s: float
    give_up_s: float
    max_behind_s: float

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s} and {self.max_s}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (0-based) of one version."""
        return float(min(self.max_s, self.initial_s * 2 ** min(attempt, 60)))


def is_transient(reason: str) -> bool:
    """Whether a load that failed for `reason` (a metric label) may succeed if tried again."""
    return reason in TRANSIENT


@dataclass(frozen=True)
class Retry:
    """A version whose load failed transiently: tried `attempts` times since `since`, next at `next_at`."""

    version: int
    attempts: int
    since: float
    next_at: float

    def after_failure(self, policy: ReloadPolicy, now: float) -> Retry | None:
        """The next retry, or None once the version has failed for longer than the give-up bound."""
        if now - self.since >= policy.give_up_s:
            return None
        return Retry(self.version, self.attempts + 1, self.since, now + policy.delay(self.attempts))
