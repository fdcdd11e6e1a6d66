"""The lease against the real broker: a record that any client of the node's topics could write (a
ttl without end, an epoch nobody can outbid, a renewal from the far future) is refused and counted,
dead-lettered when it arrives while the lease is read (not again at every start), and never keeps the
rightful process from taking the lease."""

from __future__ import annotations

import contextlib
import math
import threading
import time

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import CollectorRegistry

from sapo.kafka import DeadLetters, KafkaPublisher, KafkaReaderClient, TransportMetrics
from sapo.kafka.dlq import H_REASON
from sapo.lifecycle import StopFlag
from sapo.node.lease import FencedError, Lease, LeaseMetrics
from sapo.ops import Health
from sapo.settings import ConsumerProfile
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import lease_pb2
from sapo.wire import SCHEMA_VERSION, message_headers
from tests.integration.kafka_helpers import read_topic

pytestmark = pytest.mark.integration
NODE = "node-a"
TTL_S = 30.0
YEAR_S = 365 * 24 * 3600.0


def _forged(epoch: int, renewed_s: float, ttl_s: float) -> bytes:
    renewed_at = Timestamp()
    renewed_at.FromNanoseconds(int(renewed_s * 1e9))
    lease = lease_pb2.Lease(
        schema_version=SCHEMA_VERSION,
        node_id=NODE,
        role="sampler",
        owner="intruder/1/0",
        epoch=epoch,
        renewed_at=renewed_at,
        ttl_s=ttl_s,
    )
    return lease.SerializeToString()


@pytest.mark.parametrize(
    ("reason", "forgery"),
    [  # (epoch, renewed how long ago, ttl)
        ("lease_ttl_out_of_range", (0, 0.0, math.inf)),  # a lease that never expires
        ("lease_ttl_out_of_range", (0, 0.0, math.nan)),
        ("lease_epoch_ahead", (2**62, 2 * TTL_S, TTL_S)),  # expired, but no acquisition outbids it
        ("lease_renewed_ahead", (0, -YEAR_S, TTL_S)),  # live for a year
    ],
)
def test_a_forged_lease_record_is_refused_and_the_lease_taken(
    kafka_bootstrap: str, topic_prefix: str, reason: str, forgery: tuple[int, float, float]
) -> None:
    epoch, renewed_ago_s, ttl_s = forgery
    topics = TopicNames.for_node(NODE, topic_prefix)
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, topics.specs(), timeout_s=30)
    registry = CollectorRegistry()
    transport = TransportMetrics(registry, "sampler")
    publisher = KafkaPublisher({"bootstrap.servers": kafka_bootstrap}, transport)
    forged = _forged(epoch, time.time() - renewed_ago_s, ttl_s)
    publisher.send_sync(topics.leases, b"sampler", forged, message_headers("Lease", NODE, forged))
    stop = StopFlag()
    config = {"bootstrap.servers": kafka_bootstrap} | ConsumerProfile.local().to_librdkafka(watch=True)
    lease = Lease(
        KafkaReaderClient(config, f"{topic_prefix}.sampler-lease"),
        publisher,
        topic=topics.leases,
        node_id=NODE,
        role="sampler",
        ttl_s=TTL_S,
        idle_s=1.0,
        metrics=LeaseMetrics(registry, "sampler"),
        transport=transport,
        health=Health(),
        stop=stop,
        dead_letters=DeadLetters(publisher, topics.dlq, "sampler", transport),
    )
    acquired: list[bool] = []
    thread = threading.Thread(target=lambda: acquired.append(lease.acquire()), daemon=True)
    thread.start()
    thread.join(timeout=30)
    stop.set()  # a lease that cannot be taken: the standby gives up
    thread.join(timeout=10)

    def rejected() -> float | None:
        return registry.get_sample_value("sapo_sampler_messages_rejected_total", {"reason": reason})

    try:
        assert acquired == [True] and lease.epoch > 1  # its own acquisition, after the forged record
        lease.check(before_write=True)
        assert rejected() == 1
        # On the topic before this start: not dead-lettered again by every start that reads it.
        assert read_topic(kafka_bootstrap, topics.dlq) == []
        publisher.send_sync(topics.leases, b"sampler", forged, message_headers("Lease", NODE, forged))
        deadline = time.monotonic() + 30
        while rejected() == 1 and time.monotonic() < deadline:  # read as it arrives: dead-lettered
            with contextlib.suppress(FencedError):  # a far-ahead acquisition's epoch still fences
                lease.check(before_write=True)
            time.sleep(0.1)
        (dead,) = read_topic(kafka_bootstrap, topics.dlq)
        assert dead.headers[H_REASON] == reason.encode() and dead.value == forged
    finally:
        lease.release()
        publisher.close()
