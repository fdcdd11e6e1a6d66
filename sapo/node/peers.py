"""Per-peer metrics with bounded labels: which peers a node receives from, rejects and trains on.

A swarm can have any number of nodes, and with identity off a node id is whatever a sender claims, so
a `peer` label taken straight from the wire would let the series count grow without bound.
`PeerLabels` hands out at most `limit` labels (setting `METRICS_PEERS`): to the first peers whose
groups passed the node's filters (sampler) or were trained on (trainer), kept for the life of the
process so every series stays a monotonic counter. Everything else is counted under `OTHER`, which
no node id can be (ids are lowercase letters, digits and '-'), so the per-peer series of a metric
always add up to its total. The node's own id always has its own label (the trainer counts its local
groups there). The exact, unbounded accounting is in the run record (`StepMetrics.contributions`,
`sapo report`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from sapo.kafka.metrics import LoopCounter
from sapo.topics import NODE_ID_PATTERN

if TYPE_CHECKING:  # the sampler uses this module too, and the trainer package loads torch
    from sapo.trainer import Contribution

OTHER = "_other"
_NODE_ID = re.compile(NODE_ID_PATTERN)


class PeerLabels:
    """Label values for peers: `own`, plus the first `limit` peers `admit`ted; the rest `OTHER`."""

    def __init__(self, own: str, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0; got {limit}")
        self.limit = limit
        self._own = own
        self._labelled: set[str] = set()

    def label(self, peer: str) -> str:
        """`peer` if it has a label, else `OTHER`."""
        return peer if peer == self._own or peer in self._labelled else OTHER

    def admit(self, peer: str) -> tuple[str, bool]:
        """Give `peer` a label if it has none and one is left; its label and whether it is new."""
        if peer == self._own or peer in self._labelled:
            return peer, False
        if len(self._labelled) >= self.limit or not _NODE_ID.fullmatch(peer):
            return OTHER, False
        self._labelled.add(peer)
        return peer, True

    @property
    def own(self) -> str:
        return self._own

    @property
    def labelled(self) -> frozenset[str]:
        """The peers with their own label (the node's own id aside)."""
        return frozenset(self._labelled)


class SamplerPeerMetrics:
    """What the sampler received from each peer on the swarm stream, and what became of it."""

    def __init__(self, registry: CollectorRegistry, labels: PeerLabels) -> None:
        self.labels = labels
        self._received = LoopCounter(  # these two count every swarm record
            "sapo_sampler_peer_groups_received_total",
            "Swarm groups whose sender was established (verified with identity on), by peer.",
            ["peer"],
            registry,
        )
        self._rejected = LoopCounter(
            "sapo_sampler_peer_groups_rejected_total",
            "Swarm groups of an established sender not used, by peer and reason (the reasons of "
            "sapo_sampler_groups_rejected_total).",
            ["peer", "reason"],
            registry,
        )
        self._used = Counter(
            "sapo_sampler_peer_groups_used_total",
            "Swarm groups in batches acknowledged by the broker, by peer.",
            ["peer"],
            registry=registry,
        )
        self._init(OTHER)

    def screened(self, peer: str, reason: str | None) -> None:
        """One group of `peer` screened: pooled (`reason` None, which may give the peer a label) or
        rejected for `reason`."""
        if reason is None:
            label, new = self.labels.admit(peer)
            if new:
                self._init(label)
        else:
            label = self.labels.label(peer)
            self._rejected.inc(label, reason)
        self._received.inc(label)

    def rejected(self, peer: str, reason: str) -> None:
        self._rejected.inc(self.labels.label(peer), reason)

    def used(self, peers: Iterable[str]) -> None:
        for peer in peers:
            self._used.labels(self.labels.label(peer)).inc()

    def _init(self, label: str) -> None:
        self._received.labels(label)
        self._used.labels(label)


class TrainerPeerMetrics:
    """What each source node's groups put into this node's optimizer steps (`sapo.trainer.contributions`)."""

    def __init__(self, registry: CollectorRegistry, labels: PeerLabels) -> None:
        self.labels = labels

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"sapo_trainer_peer_{name}", doc, ["peer"], registry=registry)

        self._groups = counter("groups", "Groups trained on, by source node (the node's own id: local).")
        self._completions = counter("completions", "Completions trained on, by source node.")
        self._tokens = counter("completion_tokens", "Completion tokens trained on, by source node.")
        self._mass = counter(
            "advantage_mass", "Sum of |advantage| over the completions trained on, by source node."
        )
        for label in (OTHER, labels.own) if labels.own else (OTHER,):
            self._init(label)

    def observe(self, contributions: Iterable[Contribution]) -> None:
        totals: dict[str, tuple[int, int, int, float]] = {}
        for c in contributions:
            label, new = self.labels.admit(c.node_id)
            if new:
                self._init(label)
            g, n, t, m = totals.get(label, (0, 0, 0, 0.0))
            totals[label] = (g + c.groups, n + c.completions, t + c.completion_tokens, m + c.advantage_mass)
        for label, (g, n, t, m) in totals.items():
            self._groups.labels(label).inc(g)
            self._completions.labels(label).inc(n)
            self._tokens.labels(label).inc(t)
            self._mass.labels(label).inc(m)

    def _init(self, label: str) -> None:
        for metric in (self._groups, self._completions, self._tokens, self._mass):
            metric.labels(label)
