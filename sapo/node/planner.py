"""The trainer publishes the work of every round that may start once a policy version exists.

Why the trainer plans: a round may start when its policy version exists (lock-step: version r for
round r; async: up to `max_ahead` versions ahead of training), and the trainer is the one process that
knows when a version exists, the moment it announces it. It is also the node's fenced singleton, so one
plan is published per node. Planning right after each announcement makes "round r needs version r"
hold by construction, with no extra coordination between generator replicas.

Delivery: items are published at-least-once (flushed before the trainer goes on); a trainer that
restarts at version v plans again from round v, so items of a round it had already planned may be
published twice: a replica holding both samples one, and any group sampled twice has the same id,
which the sampler keeps once. Each item goes to partition `position % partitions`, so the replicas
of a node split a round evenly whatever the keys hash to.
"""

from __future__ import annotations

import logging

from sapo.generator.work import Pacing, plan_rounds, round_items
from sapo.kafka import DeliveryError, Publisher
from sapo.wire import message_headers

log = logging.getLogger(__name__)


class WorkPlanner:
    """Publishes work items on a node's work topic; see the module docstring."""

    def __init__(
        self,
        publisher: Publisher,
        topic: str,
        node_id: str,
        *,
        per_round: int,
        pacing: Pacing,
        flush_timeout_s: float,
        epoch: int = 0,
    ) -> None:
        self._publisher = publisher
        self._topic = topic
        self._node_id = node_id
        self._per_round = per_round
        self._pacing = pacing
        self._flush_timeout_s = flush_timeout_s
        self._epoch = epoch
        self._partitions: int | None = None
        self.next_round: int | None = None
        """The first round not planned yet; None until the first plan (then the version at start)."""

    def plan(self, version: int) -> range:
        """Publish the items of every round that may start now that `version` exists; returns them."""
        if self.next_round is None:
            self.next_round = version  # rounds below the version a trainer starts at were trained
        rounds = plan_rounds(version, self.next_round, self._pacing)
        if not rounds:
            return rounds
        if self._partitions is None:
            self._partitions = self._publisher.partitions(self._topic)
        for round_ in rounds:
            for item in round_items(self._node_id, round_, self._per_round, self._pacing):
                value = item.to_proto(self._epoch).SerializeToString()
                headers = message_headers("WorkItem", self._node_id, value)
                partition = item.position % self._partitions
                self._publisher.send(self._topic, item.key, value, headers, partition=partition)
        unsent = self._publisher.flush(self._flush_timeout_s)
        if unsent:
            raise DeliveryError(
                f"{unsent} work items unacknowledged after the flush ({self._flush_timeout_s} s, "
                "STOP_BROKER_WAIT_S once stopping)"
            )
        self.next_round = rounds.stop
        log.info("planned rounds %d..%d (%d items each)", rounds.start, rounds.stop - 1, self._per_round)
        return rounds
