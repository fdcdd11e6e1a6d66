"""Identity for a receiving service: its `TrustStore` (`sapo.identity`), the keys-topic follower,
pins and metrics.

`IdentityGate.identify` is the one entry point the sampler calls per swarm record; it persists keys
pinned on first use (open swarm) and keeps `sapo_<service>_trusted_keys` current.

The compacted `<prefix>.swarm.keys` topic (`KeysFollower`). Delivery: every receiver reads the whole
topic from the beginning with a reader in no consumer group (offsets are irrelevant: the topic is
compacted and small), first to the end before it verifies anything (`catch_up`: nothing new for
`idle_s` once assigned; the high watermark is not trusted), then between swarm records (`poll`).
Applying an announcement twice changes nothing, so re-reading is harmless. Refused announcements
are counted by reason, and the hostile ones (bad signature, a key bound to another node, a second
rotation by one key) are dead-lettered like any hostile input, once: by the receivers that read them as
they arrive, not again at every start (the loop's `history` reading, `sapo.kafka.consumer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from sapo.identity.trust import ANNOUNCEMENT_RESULTS, Rejection, Sender, TrustStore
from sapo.identity.trustlist import save_pins
from sapo.kafka import ConsumerClient, ConsumerLoop, DeadLetters, Disposition, Record, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.wire import InvalidMessageError

log = logging.getLogger(__name__)

ACCEPTED = frozenset({"added", "rotated", "pinned", "revoked", "unchanged"})
HOSTILE_ANNOUNCEMENTS = frozenset({"bad_statement", "bad_signature", "identity_mismatch", "key_conflict"})


class IdentityMetrics:
    """`sapo_<service>_key_announcements_total{result}` and `sapo_<service>_trusted_keys`."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.announcements = Counter(
            f"sapo_{service}_key_announcements_total",
            "Keys-topic announcements read, by result (added, rotated, pinned, revoked, unchanged, or "
            "the reason it was refused).",
            ["result"],
            registry=registry,
        )
        self.trusted_keys = Gauge(
            f"sapo_{service}_trusted_keys", "Keys this receiver accepts signatures from.", registry=registry
        )
        for result in ANNOUNCEMENT_RESULTS:
            self.announcements.labels(result)


class KeysFollower:
    """Applies the keys topic to `store`, with the one consumer loop."""

    def __init__(
        self,
        client: ConsumerClient,
        topic: str,
        store: TrustStore,
        *,
        metrics: IdentityMetrics,
        transport: TransportMetrics,
        stop: StopFlag,
        dead_letters: DeadLetters | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._stop = stop
        self._topic = topic
        self._loop = ConsumerLoop(
            client,
            [topic],
            self._handle,
            stop=stop,
            metrics=transport,
            dead_letters=dead_letters,
            stream_of=lambda _topic: "keys",
            history=True,
            poll_timeout_s=0.0,
        )
        metrics.trusted_keys.set(len(store))

    def open(self) -> None:
        self._loop.open()

    def close(self) -> None:
        self._loop.close()

    def catch_up(self, idle_s: float, timeout_s: float, beat: Callable[[], None] = lambda: None) -> bool:
        """Read the topic to its end; False when stopped first. Raises TimeoutError past `timeout_s`."""
        started = idle_since = time.monotonic()
        while not self._stop.is_set():
            beat()
            got = self._loop.step(0.2)
            now = time.monotonic()
            if got or not self._loop.assigned:
                idle_since = now
            elif now - idle_since >= idle_s:
                log.info("keys topic %s read: %d trusted keys", self._topic, len(self._store))
                return True
            if now - started > timeout_s:
                raise TimeoutError(
                    f"the keys topic {self._topic} was not read within {timeout_s} s; check that it "
                    "exists (`sapo topics`) or turn IDENTITY__KEYS_TOPIC off"
                )
        return False

    def poll(self) -> bool:
        """Apply whatever arrived, without waiting; True when a record was read."""
        return self._loop.step(0.0)

    def _handle(self, record: Record) -> Disposition:
        if record.value is None:  # a tombstone: keys are only ever revoked explicitly
            return Disposition.DONE
        result = self._store.apply(record.value, self._clock())
        self._metrics.announcements.labels(result).inc()
        self._metrics.trusted_keys.set(len(self._store))
        if result in ACCEPTED:
            if result != "unchanged":
                log.info("key announcement %s: %s", record.key, result)
            return Disposition.DONE
        log.warning("key announcement %s refused: %s", record.key, result)
        if result in HOSTILE_ANNOUNCEMENTS:
            raise InvalidMessageError(result, f"key announcement {record.key!r}")
        return Disposition.DONE


class IdentityGate:
    """The store plus what keeps it current: the keys topic (optional) and the pins file (tofu)."""

    def __init__(
        self,
        store: TrustStore,
        metrics: IdentityMetrics,
        *,
        follower: KeysFollower | None = None,
        pins_file: Path | None = None,
    ) -> None:
        self.store = store
        self._metrics = metrics
        self._follower = follower
        self._pins_file = pins_file
        metrics.trusted_keys.set(len(store))

    def identify(self, headers: Mapping[str, bytes], value: bytes, now_s: float) -> Sender | Rejection:
        verdict = self.store.identify(headers, value, now_s)
        new = self.store.take_new_pins()
        if new:
            if self._pins_file is not None:
                save_pins(self._pins_file, self.store)
            for entry in new:
                log.info("pinned key %s for %s on first use", entry.key_id, entry.node_id)
            self._metrics.trusted_keys.set(len(self.store))
        return verdict

    def open(self) -> None:
        if self._follower is not None:
            self._follower.open()

    def catch_up(self, idle_s: float, timeout_s: float, beat: Callable[[], None]) -> bool:
        """Read the keys topic to its end before anything is verified; False when stopped first."""
        return self._follower is None or self._follower.catch_up(idle_s, timeout_s, beat)

    def poll(self) -> None:
        if self._follower is not None:
            self._follower.poll()

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
