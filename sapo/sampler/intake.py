"""What the sampler did with each peer's swarm groups since its previous batch (`PeerIntake`).

Counted per peer whose sender was established (verified, with identity on): groups received, rejected
by reason (at screening or as a pool discard) and used in the batch. The tally is taken into each batch
(`TrainingBatch.intake`) and starts again, so the trainer's step record carries the sampler's side of
the accounting to the run record. It is an operator's account, not an exactly-once ledger: what was
counted since the last batch is lost when the sampler restarts.

At most `max_peers` (default `MAX_PEERS`) peers are tallied by name between two batches; any further
peer is added to the `OTHER` entry, so a flood of claimed node ids (identity off) cannot grow a batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from sapo.v1 import batch_pb2

MAX_PEERS: Final = 256
"""Peers tallied by name between two batches: more than any swarm this project runs."""
OTHER: Final = "_other"
"""The entry of peers beyond the limit; no node id can be this (ids are lowercase letters, digits, '-')."""


@dataclass
class _Counts:
    received: int = 0
    used: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


class IntakeTally:
    """Per-peer counts since the last `take`; see the module docstring."""

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        if max_peers < 1:
            raise ValueError(f"max_peers must be >= 1; got {max_peers}")
        self.max_peers = max_peers
        self._peers: dict[str, _Counts] = {}

    def received(self, peer: str, reason: str | None) -> None:
        """One group of `peer` screened: pooled (`reason` None) or rejected for `reason`."""
        counts = self._of(peer)
        counts.received += 1
        if reason is not None:
            counts.rejected[reason] += 1

    def rejected(self, peer: str, reason: str) -> None:
        """A pooled group of `peer` discarded for `reason` (expired, evicted, unused, ...)."""
        self._of(peer).rejected[reason] += 1

    def used(self, peers: Iterable[str]) -> None:
        for peer in peers:
            self._of(peer).used += 1

    def take(self) -> list[batch_pb2.PeerIntake]:
        """The counts since the last take, by peer id (OTHER last), and a fresh start."""
        taken = [
            batch_pb2.PeerIntake(node_id=peer, received=c.received, used=c.used, rejected=dict(c.rejected))
            for peer, c in sorted(self._peers.items(), key=lambda item: (item[0] == OTHER, item[0]))
        ]
        self._peers = {}
        return taken

    def _of(self, peer: str) -> _Counts:
        counts = self._peers.get(peer)
        if counts is None:  # not `setdefault(peer, _Counts())`: that builds a _Counts every call
            if len(self._peers) >= self.max_peers:
                peer = OTHER
            counts = self._peers.get(peer)
            if counts is None:
                counts = self._peers[peer] = _Counts()
        return counts
