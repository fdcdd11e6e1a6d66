"""The single-writer lease over the in-memory transport: one holder, standbys that wait, release,
and a holder fenced by a newer acquisition or unable to renew."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from sapo.kafka import DeadLetters, Publisher, Record, TransportMetrics
from sapo.kafka.errors import DeliveryError
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag
from sapo.node.lease import MAX_CLOCK_AHEAD_S, FencedError, Lease, LeaseLostError, LeaseMetrics
from sapo.ops import Health
from sapo.v1 import lease_pb2
from sapo.wire import SCHEMA_VERSION

pytestmark = pytest.mark.unit
TOPIC, DLQ = "sapo.node.node-a.leases", "sapo.node.node-a.dlq"
TTL = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


REGISTRIES: dict[int, CollectorRegistry] = {}
HEALTHS: dict[int, Health] = {}


def lease(
    bus: MemoryBus,
    clock: Clock,
    name: str,
    publisher: Publisher | None = None,
    client: MemoryConsumerClient | None = None,
    *,
    dead_letters: bool = False,
) -> Lease:
    registry, health = CollectorRegistry(), Health()
    transport = TransportMetrics(registry, "sampler")
    made = Lease(
        client or MemoryConsumerClient(bus, f"lease-{name}"),
        publisher or MemoryPublisher(bus),
        topic=TOPIC,
        node_id="node-a",
        role="sampler",
        ttl_s=TTL,
        idle_s=0.0,
        metrics=LeaseMetrics(registry, "sampler"),
        transport=transport,
        health=health,
        stop=StopFlag(),
        dead_letters=DeadLetters(MemoryPublisher(bus), DLQ, "sampler", transport) if dead_letters else None,
        clock=clock,
    )
    REGISTRIES[id(made)] = registry
    HEALTHS[id(made)] = health
    return made


def metric(held: Lease, name: str, labels: dict[str, str] | None = None) -> float | None:
    return REGISTRIES[id(held)].get_sample_value(name, labels)


def acquire_in_background(candidate: Lease) -> threading.Thread:
    thread = threading.Thread(target=candidate.acquire, daemon=True)
    thread.start()
    return thread


def test_the_first_process_holds_the_lease_and_its_epoch_is_its_records_offset() -> None:
    bus, clock = MemoryBus(), Clock()
    first = lease(bus, clock, "a")
    assert first.acquire()
    assert first.epoch == 1 and first.holder is not None  # offset 0 + 1 and first.holder.owner == first.owner
    first.check(before_write=True)
    assert metric(first, "sapo_sampler_lease_held") == 1


def test_a_second_process_stands_by_until_the_holder_releases() -> None:
    bus, clock = MemoryBus(), Clock()
    holder = lease(bus, clock, "a")
    assert holder.acquire()
    standby = lease(bus, clock, "b")
    thread = acquire_in_background(standby)
    thread.join(timeout=1.5)
    assert thread.is_alive() and standby.epoch == 0  # waits, writes nothing
    assert metric(standby, "sapo_sampler_lease_held") == 0
    # Ready all the same, as the holder: a Deployment with a standby finishes its rollout.
    assert HEALTHS[id(standby)].failing() == [] and HEALTHS[id(holder)].failing() == []
    first_epoch = holder.epoch
    holder.release()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert standby.epoch > first_epoch


def test_a_holder_that_stopped_renewing_is_replaced_and_fenced_before_its_next_write() -> None:
    bus, clock = MemoryBus(), Clock()
    old = lease(bus, clock, "a")
    assert old.acquire()
    clock.now += TTL + 1  # old was paused past its ttl
    new = lease(bus, clock, "b")
    assert new.acquire()
    assert new.epoch > old.epoch
    with pytest.raises(FencedError, match="took over"):
        old.check(before_write=True)
    assert metric(old, "sapo_sampler_fenced_total") == 1
    assert old.epoch == 0
    new.check(before_write=True)  # the new holder carries on


def test_a_holder_that_cannot_renew_stops_writing_before_its_lease_could_expire() -> None:
    bus, clock = MemoryBus(), Clock()

    class Failing(MemoryPublisher):
        fail = False

        def send_sync(self, *args: object, **kwargs: object) -> tuple[int, int]:
            if self.fail:
                raise RuntimeError("broker unreachable")
            return super().send_sync(*args, **kwargs)  # type: ignore[arg-type]

    publisher = Failing(bus)
    holder = lease(bus, clock, "a", publisher)
    assert holder.acquire()
    publisher.fail = True
    clock.now += TTL / 2  # renewals fail from here on
    holder.check(before_write=True)
    clock.now += TTL * 0.35
    with pytest.raises(LeaseLostError, match="renewed"):
        holder.check(before_write=True)


def test_asking_for_the_lease_while_the_broker_is_away_retries_until_it_answers() -> None:
    """A restart that meets a broker restart must not crash on the unacknowledged first write."""
    bus, clock = MemoryBus(), Clock()

    class Away(MemoryPublisher):
        refusals = 2

        def send_sync(self, *args: object, **kwargs: object) -> tuple[int, int]:
            if self.refusals:
                self.refusals -= 1
                raise DeliveryError("no acknowledgement from the leases topic within 2.0s")
            return super().send_sync(*args, **kwargs)  # type: ignore[arg-type]

    publisher = Away(bus)
    candidate = lease(bus, clock, "a", publisher)
    assert candidate.acquire()
    assert publisher.refusals == 0 and candidate.epoch > 0


def test_a_stop_cuts_short_only_the_wait_to_acquire_never_a_renewal_or_the_release() -> None:
    """A process asked to stop while its broker is out of reach should not sit out the acknowledgement
    timeout for a lease it does not hold; a holder asked to stop still renews while it writes its final
    state, and releases."""
    bus, clock = MemoryBus(), Clock()

    class Silent(MemoryPublisher):
        """Never acknowledges what it may give up on (a cancellable wait), until told to."""

        answering = False
        waits: ClassVar[list[bool]] = []

        def send_sync(self, *args: object, **kwargs: object) -> tuple[int, int]:
            cancel = kwargs.get("cancel")
            self.waits.append(cancel is not None)
            if callable(cancel) and not self.answering:
                while not cancel():
                    threading.Event().wait(0.01)
                raise DeliveryError("stopped waiting for the acknowledgement")
            return super().send_sync(*args, **kwargs)  # type: ignore[arg-type]

    publisher = Silent(bus)
    candidate = lease(bus, clock, "a", publisher)
    thread = acquire_in_background(candidate)
    while not publisher.waits:
        threading.Event().wait(0.01)
    candidate._stop.set()
    thread.join(30)
    assert not thread.is_alive() and candidate.epoch == 0  # gave up asking, holds nothing

    holder = lease(bus, clock, "b", publisher)
    publisher.answering = True
    assert holder.acquire()
    publisher.answering = False
    holder._stop.set()
    publisher.waits.clear()
    holder._renew()
    holder.release()
    assert publisher.waits == [False, False]  # neither could be cut short
    assert holder.holder is not None and holder.epoch == 0


class ResetConsumerClient(MemoryConsumerClient):
    """Starts a partition over at its beginning when its position lies beyond its end, as librdkafka
    does (auto.offset.reset=earliest) for a topic deleted and created again."""

    def poll(self, timeout: float) -> Record | None:
        for tp, pos in self._positions.items():
            if pos > len(self._bus.topics.get(tp[0], [])):
                self._positions[tp] = 0
        return super().poll(timeout)


def test_a_holder_whose_leases_topic_was_created_again_stops_writing() -> None:
    """Its renewals carry an epoch the new topic never gave (refused as lease_epoch_ahead): left to
    run, it would write on while a standby took the lease with a lower epoch that cannot fence it."""
    bus, clock = MemoryBus(), Clock()
    first = lease(bus, clock, "a")
    assert first.acquire()
    first.release()
    holder = lease(bus, clock, "b", client=ResetConsumerClient(bus, "lease-b"))
    assert holder.acquire() and holder.epoch == 3
    bus.topics[TOPIC] = []  # deleted and created again
    clock.now += TTL / 3
    holder.check(before_write=True)  # renews: the record lands at offset 0 with epoch 3
    with pytest.raises(LeaseLostError, match="no longer holds the acquisition of epoch 3"):
        holder.check(before_write=True)
    assert holder.epoch == 0 and metric(holder, "sapo_sampler_fenced_total") == 1


def test_an_acquisition_from_a_clock_far_ahead_still_fences_the_holder_it_outbid() -> None:
    """A process whose clock runs ahead by more than a ttl sees a live holder as expired and takes the
    lease. Its records are refused as `lease_renewed_ahead`, and its epoch used to go with them: the
    holder never saw the higher epoch and wrote on beside it, two samplers of one node. Its renewals
    still never keep the lease live for a reader with the right time."""
    bus, clock, ahead = MemoryBus(), Clock(), Clock()
    ahead.now += MAX_CLOCK_AHEAD_S + TTL
    holder = lease(bus, clock, "a")
    assert holder.acquire()
    intruder = lease(bus, ahead, "b")
    assert intruder.acquire() and intruder.epoch > holder.epoch
    with pytest.raises(FencedError):
        holder.check(before_write=True)
    standby = lease(bus, clock, "c")
    assert standby.acquire() and standby.epoch > intruder.epoch  # at once: it is not live on this clock


def test_a_refused_lease_record_is_dead_lettered_once_not_again_at_every_start() -> None:
    """Every sampler and trainer reads the leases topic whole at every start (the embedded broker never
    compacts it): a record the processes running when it arrived refused and dead-lettered is counted,
    not dead-lettered again by each later start."""
    bus, clock = MemoryBus(), Clock()
    holder = lease(bus, clock, "a", dead_letters=True)
    assert holder.acquire()
    hostile = lease_pb2.Lease(
        schema_version=SCHEMA_VERSION, node_id="node-a", role="sampler", owner="x", ttl_s=1e9
    )
    bus.append(TOPIC, b"sampler", hostile.SerializeToString(), [])
    holder.check(before_write=True)  # read as it arrived: dead-lettered
    holder.release()
    later = lease(bus, clock, "b", dead_letters=True)
    assert later.acquire()
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[DLQ]] == [b"lease_ttl_out_of_range"]
    assert metric(later, "sapo_sampler_messages_rejected_total", {"reason": "lease_ttl_out_of_range"}) == 1
