"""Consumer lag per assigned partition, and the brokers a client is connected to, from librdkafka's
statistics, as gauges.

librdkafka computes per-partition offsets from what it already knows and hands them to the application
every `statistics.interval.ms` (the `stats_cb`, served by `poll`, so on the consumer loop's own thread):
no extra request to the brokers, unlike a watermark query per partition per scrape. The high watermark
comes from fetch responses (on the embedded broker too, whose ListOffsets answer can be too low).

Lag here is `hi_offset - app_offset`: messages the service has not read yet. librdkafka's own
`consumer_lag` is measured from the committed offset instead, which our loop keeps behind records it
holds on purpose (a sampler's pooled groups, a trainer's batches until their checkpoint), so it would
report a busy, healthy consumer as behind. Before the first message of an assignment is read, the
position is the committed offset, or the low watermark when there is none (auto.offset.reset=earliest).

While the cluster is out of reach the lag gauges keep their last values (no fetch answers), so the same
statistics also say how many of the cluster's brokers the client is connected to (`brokers_up`): 0
through an outage, which no other metric shows (librdkafka only logs it, `sapo.clientlog`). A process
has several clients of one cluster, each connected to the brokers it needs (a reader of one partition
to its leader, a group member to its coordinator as well), so `BrokersUp` exports the most any open
client reaches: 0 only while none reaches a broker.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Gauge

from sapo.kafka.records import TopicPartition

log = logging.getLogger(__name__)

_INVALID = -1001  # librdkafka's RD_KAFKA_OFFSET_INVALID: not known (yet)


def partition_lags(stats: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """Unread messages of every assigned partition with a known high watermark, from one statistics
    object (librdkafka's STATISTICS.md: topics -> partitions -> offsets)."""
    lags: dict[TopicPartition, int] = {}
    for topic, entry in stats.get("topics", {}).items():
        for key, p in entry.get("partitions", {}).items():
            partition = int(key)
            high = int(p.get("hi_offset", _INVALID))
            if partition < 0 or not p.get("desired", False) or high < 0:  # -1: the unassigned queue
                continue
            position = next(
                (
                    int(p[name])
                    for name in ("app_offset", "committed_offset", "lo_offset")
                    if int(p.get(name, _INVALID)) >= 0
                ),
                None,
            )
            if position is not None:
                lags[(topic, partition)] = max(0, high - position)
    return lags


def brokers_up(stats: Mapping[str, Any]) -> int:
    """How many of the cluster's brokers (known by node id, not the bootstrap addresses) the client is
    connected to, from one statistics object (brokers -> state "UP")."""
    brokers = stats.get("brokers", {}).values()
    return sum(1 for b in brokers if int(b.get("nodeid", -1)) >= 0 and b.get("state") == "UP")


BrokersSetter = Callable[[int | None], None]
"""One client's report to `BrokersUp`: its brokers up at each statistics, None once it closes."""


class BrokersUp:
    """`gauge{connection}`: the most brokers any open client of the process is connected to on that
    connection. Each client's own count would overwrite the others' (a gauge that saws between the
    counts of clients that need different brokers, and reads 0 while one of them alone is cut off), and
    a closed client's last count would stay. A connection's series appears with its first client's
    first statistics (created at 0 it would read as an outage, for ever where statistics are off) and
    goes with its last client."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._lock = threading.Lock()  # clients poll, so report, on their own threads
        self._up: dict[str, dict[int, int]] = {}  # connection -> client -> brokers up
        self._clients = itertools.count()

    def client(self, connection: str) -> BrokersSetter:
        """The setter one client of `connection` reports through."""
        return functools.partial(self._report, connection, next(self._clients))

    def _report(self, connection: str, client: int, up: int | None) -> None:
        with self._lock:
            counts = self._up.setdefault(connection, {})
            if up is not None:
                counts[client] = up
            else:
                counts.pop(client, None)
            if counts:
                self._gauge.labels(connection).set(max(counts.values()))
                return
            del self._up[connection]
            with contextlib.suppress(KeyError):  # no client of it had reported yet
                self._gauge.remove(connection)


class LagGauge:
    """Sets `gauge{topic, partition}` from each statistics callback of one client, and removes the
    series of partitions the client no longer reports (revoked) or when it closes; with `brokers`, hands
    it `brokers_up` as well, and None when the client closes (`BrokersUp`)."""

    def __init__(self, gauge: Gauge, brokers: BrokersSetter | None = None) -> None:
        self._gauge = gauge
        self._brokers = brokers
        self._shown: set[TopicPartition] = set()

    def on_stats(self, raw: str) -> None:
        """librdkafka's `stats_cb`: never raises (a bad statistics object only costs its update)."""
        try:
            stats = json.loads(raw)
            lags = partition_lags(stats)
            up = brokers_up(stats)
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("unreadable librdkafka statistics: %s", exc)
            return
        if self._brokers is not None:
            self._brokers(up)
        for (topic, partition), lag in lags.items():
            self._gauge.labels(topic, str(partition)).set(lag)
        self._remove(self._shown - lags.keys())
        self._shown = set(lags)

    def clear(self) -> None:
        self._remove(self._shown)
        self._shown = set()
        if self._brokers is not None:
            self._brokers(None)

    def _remove(self, tps: set[TopicPartition]) -> None:
        for topic, partition in tps:
            with contextlib.suppress(KeyError):  # another client of this process removed it already
                self._gauge.remove(topic, str(partition))
