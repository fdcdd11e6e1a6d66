"""Stop flag and signal handling: SIGTERM/SIGINT set a flag; loops finish their unit and close."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)


class StopFlag:
    """A thread-safe flag that loops check between units of work."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "requested") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


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
