"""The receiving side's plumbing over the in-memory transport: the keys topic read to its end and
then polled, hostile announcements counted and dead-lettered, pins persisted."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sapo.identity import NodeKey, Sender, TrustStore
from sapo.identity.announce import add_statement, record_key
from sapo.identity.trustlist import load_trust_list
from sapo.kafka import DeadLetters, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag
from sapo.node.identity import IdentityGate, IdentityMetrics, KeysFollower
from tests.unit.identity.helpers import NOW, rotate, signed

pytestmark = pytest.mark.unit

KEYS_TOPIC, DLQ = "t.swarm.keys", "t.node.n.dlq"


def gate(
    bus: MemoryBus, store: TrustStore, pins: Path | None = None
) -> tuple[IdentityGate, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = IdentityMetrics(registry, "sampler")
    transport = TransportMetrics(registry, "sampler")
    follower = KeysFollower(
        MemoryConsumerClient(bus, "keys"),
        KEYS_TOPIC,
        store,
        metrics=metrics,
        transport=transport,
        stop=StopFlag(),
        dead_letters=DeadLetters(MemoryPublisher(bus), DLQ, "sampler", transport),
        clock=lambda: NOW,
    )
    return IdentityGate(store, metrics, follower=follower, pins_file=pins), registry


def test_the_keys_topic_is_applied_in_order_and_hostile_announcements_dead_lettered_once() -> None:
    bus = MemoryBus()
    old, new, thief = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    store = TrustStore()
    store.add("node-a", old.public, "file")
    good = add_statement("node-a", new.public, NOW, previous_key_id=old.key_id, overlap_s=60)
    bus.append(KEYS_TOPIC, record_key(good), rotate("node-a", old, new, overlap_s=60), [])
    bus.append(KEYS_TOPIC, b"node-a/x", rotate("node-a", old, thief, overlap_s=60), [])  # a second rotation
    bus.append(KEYS_TOPIC, b"junk", b"\xff\x00", [])
    identity, registry = gate(bus, store)
    identity.open()
    assert identity.catch_up(idle_s=0.05, timeout_s=5, beat=lambda: None)

    def count(name: str, labels: dict[str, str] | None = None) -> float:
        return registry.get_sample_value(name, labels or {}) or 0.0

    assert count("sapo_sampler_key_announcements_total", {"result": "rotated"}) == 1
    assert count("sapo_sampler_key_announcements_total", {"result": "key_conflict"}) == 1
    assert count("sapo_sampler_key_announcements_total", {"result": "bad_statement"}) == 1
    # On the topic before this start: dead-lettered by the receivers that read them as they arrived.
    assert DLQ not in bus.topics
    assert count("sapo_sampler_trusted_keys") == 2
    assert identity.identify(*signed("node-a", new), NOW) == Sender("node-a", new.key_id)

    later = NodeKey.generate()  # announced after the catch-up: picked up by poll()
    bus.append(KEYS_TOPIC, b"node-a/later", rotate("node-a", new, later, overlap_s=60), [])
    bus.append(KEYS_TOPIC, b"node-a/y", rotate("node-a", new, thief, overlap_s=60), [])  # live: dead-lettered
    for _ in range(2):
        identity.poll()
    assert identity.identify(*signed("node-a", later), NOW) == Sender("node-a", later.key_id)
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[DLQ]] == [b"key_conflict"]
    identity.close()


def test_keys_pinned_on_first_use_are_written_to_the_pins_file(tmp_path: Path) -> None:
    pins = tmp_path / "pins.yaml"
    key = NodeKey.generate()
    identity, registry = gate(MemoryBus(), TrustStore(tofu=True), pins)
    assert identity.identify(*signed("node-a", key), NOW) == Sender("node-a", key.key_id)
    assert load_trust_list(pins).nodes == {"node-a": (key.public_text,)}
    assert registry.get_sample_value("sapo_sampler_trusted_keys") == 1
