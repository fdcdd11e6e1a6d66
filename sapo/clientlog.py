"""librdkafka's log lines and client errors, through Python logging, once per cause.

Every Kafka client of the project is given `LIBRDKAFKA_LOG` as its logger, so librdkafka's lines go
through the service's formatter (one JSON object a line under `LOG_FORMAT=json`) instead of straight
to stderr as plain text. A client that cannot reach its brokers logs a failed connect on every
reconnect attempt (tens a second across a service's clients); `RepeatFilter` lets the first line of
each kind through and then one per `interval_s`, saying how many it held back.

`ClientErrors` is every client's `error_cb`. librdkafka reports there, among transient errors it
retries by itself, that no broker of `bootstrap.servers` can be reached: that becomes one ERROR line
naming the setting to check, repeated once per `interval_s` while it lasts. The client keeps retrying:
a broker that starts after the service (a first install, a rolling restart) is found without a restart.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Final

from confluent_kafka import KafkaError

log = logging.getLogger(__name__)

LIBRDKAFKA_LOG: Final = logging.getLogger("sapo.librdkafka")
"""The logger every Kafka client is given (a command that reports a failure itself can quiet it)."""

REPEAT_INTERVAL_S: Final = 60.0
_MAX_KINDS = 1024
_NUMBER = re.compile(r"\d+")


def line_kind(text: str) -> str:
    """What makes two lines the same kind: the text with its numbers blanked (timings, ports, ids)."""
    return _NUMBER.sub("#", text)


class RepeatFilter(logging.Filter):
    """Passes the first record of each kind, then at most one per `interval_s`, which says how many of
    its kind were held back since the last one passed."""

    def __init__(
        self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._passed: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        kind = line_kind(text)
        now = self._clock()
        last = self._passed.get(kind)
        if last is not None and now - last < self._interval_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        if len(self._passed) >= _MAX_KINDS and kind not in self._passed:
            self._passed.clear()  # bounded: a flood of distinct lines forgets what it saw, it never grows
            self._held.clear()
        self._passed[kind] = now
        held = self._held.pop(kind, 0)
        if held:
            record.msg, record.args = f"{text} ({held} more like it in the last {self._interval_s:.0f} s)", ()
        return True


LIBRDKAFKA_LOG.addFilter(RepeatFilter())


_LOGGED_BY_LIBRDKAFKA: Final = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})
"""Errors librdkafka's own log line already says (a refused connect, an unknown host name)."""


_LOGGED: dict[tuple[str, int], float] = {}
"""When each (bootstrap servers, error code) was last logged, shared by the clients of a process: a
service's producer and consumers find a cluster out of reach together, and one line says it."""


class ClientErrors:
    """A client's `error_cb`: brokers out of reach as one ERROR line naming `setting`; other errors as
    warnings; both once per cluster and kind per `interval_s` (`logged`: when each was last logged)."""

    def __init__(
        self,
        bootstrap: str,
        setting: str = "bootstrap.servers",
        *,
        interval_s: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        logged: dict[tuple[str, int], float] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._setting = setting
        self._interval_s = interval_s
        self._clock = clock
        self._logged = _LOGGED if logged is None else logged

    def __call__(self, err: KafkaError) -> None:
        code = err.code()
        if code in _LOGGED_BY_LIBRDKAFKA:
            return
        now = self._clock()
        last = self._logged.get((self._bootstrap, code))
        if last is not None and now - last < self._interval_s:
            return
        self._logged[(self._bootstrap, code)] = now
        if code == KafkaError._ALL_BROKERS_DOWN:
            log.error(
                "no Kafka broker reachable at %s (%s): check %s and that the brokers are up and "
                "listening there; retrying",
                self._bootstrap,
                err.str(),
                self._setting,
            )
        else:
            log.warning("Kafka client error (%s): %s", err.name(), err.str())


def client_hooks(config: dict[str, str], setting: str) -> dict[str, object]:
    """The logger and error callback to add to a client's `config` (`setting`: where its
    `bootstrap.servers` came from, e.g. `SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS`)."""
    return {"logger": LIBRDKAFKA_LOG, "error_cb": ClientErrors(config.get("bootstrap.servers", "?"), setting)}
