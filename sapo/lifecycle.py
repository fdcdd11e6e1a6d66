"""Stop flag and signal handling: SIGTERM/SIGINT set a flag; loops finish their unit and close.

A stop also bounds every later wait for the Kafka broker (`StopFlag.deadline`): a stopping service
that finds its broker gone must still exit well within its grace period (Kubernetes' SIGKILL after
terminationGracePeriodSeconds), so what it cannot deliver is left undelivered and uncommitted, and
redone after the restart, rather than waited for until the kill cuts everything short.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

log = logging.getLogger(__name__)


class StopFlag:
    """A thread-safe flag that loops check between units of work. With `broker_wait_s`, once set it
    bounds each wait for the broker to that long, and to nothing once an acknowledgement did not come
    within it (`broker_unanswered`, which the producer reports)."""

    def __init__(self, broker_wait_s: float | None = None) -> None:
        """`broker_wait_s` None: a stop shortens no wait (tools, tests of other things)."""
        self._event = threading.Event()
        self.reason = ""
        self._broker_wait_s = broker_wait_s
        self._set_at: float | None = None
        self._broker_gone = False

    def set(self, reason: str = "requested") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._set_at = time.monotonic()
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def deadline(self, start: float, timeout_s: float) -> float:
        """When a wait for the broker begun at `start` (`time.monotonic`) for up to `timeout_s` ends,
        asked again as it goes on (a stop may come while it waits): while stopping, at most
        `broker_wait_s` after the later of its start and the stop. A broker that answers at all
        acknowledges within milliseconds, so this cuts short only waits on a broker that is gone; and
        once one such wait ran out (`broker_unanswered`), every later one ends at once: each would only
        run out again, and their sum would outlast the grace period."""
        end = start + timeout_s
        set_at, bound = self._set_at, self.broker_wait_s()
        if set_at is None or bound is None:
            return end
        return min(end, max(start, set_at) + bound)

    def broker_wait_s(self) -> float | None:
        """How long a wait for the broker begun now may last (`deadline`): None while no stop bounds it."""
        if self._set_at is None or self._broker_wait_s is None:
            return None
        return 0.0 if self._broker_gone else self._broker_wait_s

    def broker_unanswered(self) -> None:
        """A wait for the broker ran out while stopping: later waits (`deadline`) end at once."""
        if self.is_set() and self._broker_wait_s is not None and not self._broker_gone:
            self._broker_gone = True
            log.warning(
                "the Kafka broker did not answer within %.1f s of the stop: what is left is not "
                "delivered, nor its input committed, and is redone after the restart",
                self._broker_wait_s,
            )


def install_signal_handlers(flag: StopFlag) -> None:
    """SIGTERM and SIGINT set the flag once; a second signal exits at once (the operator insists)."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if flag.is_set():
            log.warning("second %s: exiting without clean shutdown", name)
            raise SystemExit(128 + signum)
        log.info("%s received: stopping after the current unit", name)
        flag.set(name)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
