"""Transport metrics, declared once per service on an injected registry."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily

from sapo.kafka.errors import PRODUCE_ERROR_KINDS
from sapo.kafka.lag import BrokersUp


class LoopGauges(Protocol):
    """What `TransportMetrics` reads of a consumer loop at scrape time."""

    assigned: set[tuple[str, int]]

    def pending_count(self) -> int: ...


class LoopCounter:
    """A labelled Prometheus counter for the paths that count every record: plain numbers bumped by the
    service's loop thread and read at scrape time. `Counter.labels(...).inc()` takes a lock and checks
    the label values on every call, then takes the child's lock (~1.5-3 us a count on a 2-core VM),
    and a sampler of a 10,000-node swarm counts three to five things for each of ~8,000 records a
    second. Exposed as a `Counter` of the same name would be (`<name>_total` and `<name>_created` per
    series), through prometheus_client's custom-collector interface.

    One writer thread only: an increment reads and writes a dict entry, which two writers could
    interleave (every service counts on its main thread; the ops server's thread only reads, from a
    copy). Series are never removed, so only for bounded label sets (ours are: streams, reasons,
    peers through `sapo.node.peers.PeerLabels`)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name.removesuffix("_total")
        self._doc = documentation
        self._labelnames = tuple(labelnames)
        self._counts: dict[tuple[str, ...], float] = {}
        self._created: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def inc(self, *values: str) -> None:
        """Count one for the series of these label values."""
        try:  # one lookup and one store of the label tuple when the series exists
            self._counts[values] += 1
        except KeyError:
            self._declare(values, 1)

    def labels(self, *values: str) -> None:
        """Expose the series of these label values at 0 until it is counted (as `Counter.labels`)."""
        if values not in self._counts:
            self._declare(values, 0)

    def _declare(self, values: tuple[str, ...], count: float) -> None:
        if len(values) != len(self._labelnames) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{self._name} takes label values for {self._labelnames}; got {values!r}")
        self._created[values] = time.time()  # before the count, so a scrape never sees one without it
        self._counts[values] = count

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = self._family()
        counts = self._counts.copy()
        created = self._created.copy()  # after the counts: `_declare` writes a series' created first
        for values, count in counts.items():
            family.add_metric(list(values), count, created=created[values])
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield self._family()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._doc, labels=self._labelnames)


def catalogue(*parts: Iterable[str]) -> tuple[str, ...]:
    """The reasons of `parts`, each once, in order: a service's refusals from the tuples beside the code
    that refuses."""
    return tuple(dict.fromkeys(reason for part in parts for reason in part))


class TransportMetrics:
    """`sapo_<service>_messages_*`: what the consumer loop and producer did, by bounded labels.

    `refusals` is every reason the service's loops can reject or dead-letter a record for: each is
    exposed at 0 from the start, since `increase()` cannot see the first count of a series born at 1
    (the dead-letter alerts would miss a new reason's first burst)."""

    def __init__(self, registry: CollectorRegistry, service: str, refusals: Iterable[str] = ()) -> None:
        p = f"sapo_{service}"
        self.consumed = LoopCounter(
            f"{p}_messages_consumed_total", "Messages read from Kafka, by stream.", ["stream"], registry
        )
        self.rejected = LoopCounter(
            f"{p}_messages_rejected_total", "Messages skipped, by reason.", ["reason"], registry
        )
        self.dead_lettered = Counter(
            f"{p}_messages_dead_lettered_total",
            "Messages sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=registry,
        )
        self.produced = Counter(
            f"{p}_messages_produced_total", "Messages acknowledged by the broker.", registry=registry
        )
        self.produce_errors = Counter(
            f"{p}_produce_errors_total",
            "Messages not sent or not acknowledged, by kind (sapo.kafka.producer.error_kind).",
            ["kind"],
            registry=registry,
        )
        self.dead_letters_failed = Counter(
            f"{p}_dead_letters_failed_total",
            "Rejected messages whose dead letter could not be sent (counted, dropped), by kind.",
            ["kind"],
            registry=registry,
        )
        for kind in PRODUCE_ERROR_KINDS:
            self.produce_errors.labels(kind)
            self.dead_letters_failed.labels(kind)
        for reason in refusals:
            self.rejected.labels(reason)
            self.dead_lettered.labels(reason)
        # A service's loops share these two (a sampler reads three streams): summed over the open
        # loops at scrape time, never set per record.
        self._loops: list[LoopGauges] = []
        self.pending = Gauge(
            f"{p}_messages_pending", "Consumed messages not yet finished (uncommittable).", registry=registry
        )
        self.pending.set_function(lambda: sum(loop.pending_count() for loop in list(self._loops)))
        self.consumer_lag = Gauge(
            f"{p}_consumer_lag_messages",
            "Messages between an assigned partition's high watermark and this consumer's position "
            "(not yet read), from librdkafka's statistics (sapo.kafka.lag).",
            ["topic", "partition"],
            registry=registry,
        )
        self.brokers_up = BrokersUp(
            Gauge(
                f"{p}_kafka_brokers_up",
                "Brokers of the cluster (connection: node, or swarm for a separate swarm cluster) the "
                "service's consumers were connected to at their last librdkafka statistics, the most of "
                "any open consumer (sapo.kafka.lag): 0 while the cluster is out of reach.",
                ["connection"],
                registry=registry,
            )
        )
        self.assigned_partitions = Gauge(
            f"{p}_assigned_partitions",
            "Partitions currently assigned to this service's consumers.",
            registry=registry,
        )
        self.assigned_partitions.set_function(lambda: sum(len(loop.assigned) for loop in list(self._loops)))

    def track(self, loop: LoopGauges) -> None:
        """Count an open consumer loop's pending records and assigned partitions in the gauges."""
        self._loops.append(loop)

    def untrack(self, loop: LoopGauges) -> None:
        if loop in self._loops:
            self._loops.remove(loop)
