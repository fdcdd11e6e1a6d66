"""Per-peer metrics: a bounded set of peer labels, the rest under OTHER, totals preserved."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sapo.node.metrics import SamplerMetrics, TrainerMetrics
from sapo.node.peers import OTHER, PeerLabels
from sapo.trainer import Contribution

pytestmark = pytest.mark.unit


def test_labels_go_to_the_first_admitted_peers_and_stay() -> None:
    labels = PeerLabels("node-a", limit=2)
    assert labels.label("node-b") == OTHER  # not admitted yet
    assert labels.admit("node-b") == ("node-b", True)
    assert labels.admit("node-b") == ("node-b", False)
    assert labels.admit("node-c") == ("node-c", True)
    assert labels.admit("node-d") == (OTHER, False)  # no label left
    assert labels.admit("node-a") == ("node-a", False)  # the node itself always has its label
    assert labels.admit("Not A Node Id!") == (OTHER, False)
    assert labels.labelled == {"node-b", "node-c"}
    assert [labels.label(p) for p in ("node-a", "node-b", "node-c", "node-d")] == [
        "node-a",
        "node-b",
        "node-c",
        OTHER,
    ]


def test_no_node_id_can_take_the_other_label() -> None:
    labels = PeerLabels("node-a", limit=5)
    assert labels.admit(OTHER) == (OTHER, False)
    assert labels.labelled == frozenset()


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


def test_sampler_counts_per_peer_with_bounded_labels() -> None:
    registry = CollectorRegistry()
    metrics = SamplerMetrics(registry, PeerLabels("node-a", limit=1))
    peers = metrics.peers
    peers.screened("node-b", "no_signal")  # rejected before it had a label: counted under OTHER
    peers.screened("node-b", None)  # takes the one label
    peers.screened("node-c", None)  # none left
    peers.rejected("node-c", "expired")
    peers.used(["node-b", "node-c", "node-b"])

    received = "sapo_sampler_peer_groups_received_total"
    assert _value(registry, received, peer="node-b") == 1
    assert _value(registry, received, peer=OTHER) == 2
    used = "sapo_sampler_peer_groups_used_total"
    assert (_value(registry, used, peer="node-b"), _value(registry, used, peer=OTHER)) == (2, 1)
    rejected = "sapo_sampler_peer_groups_rejected_total"
    assert _value(registry, rejected, peer=OTHER, reason="no_signal") == 1
    assert _value(registry, rejected, peer=OTHER, reason="expired") == 1
    peer_values = {s.labels["peer"] for m in registry.collect() for s in m.samples if "peer" in s.labels}
    assert peer_values == {"node-b", OTHER}


def test_trainer_adds_contributions_per_label_and_keeps_the_total() -> None:
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, PeerLabels("node-a", limit=1))
    metrics.peers.observe(
        [
            Contribution("node-a", 2, 8, 100, 4.0),
            Contribution("node-b", 1, 4, 50, 2.5),
            Contribution("node-c", 1, 4, 30, 1.5),
            Contribution("node-d", 1, 3, 20, 0.5),
        ]
    )
    tokens = "sapo_trainer_peer_completion_tokens_total"
    assert _value(registry, tokens, peer="node-a") == 100
    assert _value(registry, tokens, peer="node-b") == 50
    assert _value(registry, tokens, peer=OTHER) == 50
    mass = "sapo_trainer_peer_advantage_mass_total"
    assert _value(registry, mass, peer=OTHER) == pytest.approx(2.0)
    assert _value(registry, "sapo_trainer_peer_groups_total", peer=OTHER) == 2
    assert _value(registry, "sapo_trainer_peer_completions_total", peer="node-a") == 8
