"""The sampler's view of its node's trainer: the announcements on the node's compacted policy topic.

Each announcement says which batch sequence the trainer accepts next (`sapo.sampler.core`): the sampler
never numbers a batch below it, so a node whose batch topic was re-created while its checkpoints
stayed (a reinstall) goes on training instead of having every batch skipped as already trained.
Recovery reads the topic once before anything is consumed (`sapo.node.recovery`); this follower then
polls it in every sampler step, before the node's own groups, for announcements made after that.

Delivery: a reader in no consumer group per process (`sapo.kafka.KafkaReaderClient`), so the whole
(compacted, small) topic is read from the beginning on every start; applying an announcement twice
changes nothing. An invalid or foreign update is counted as rejected and skipped (the generators
dead-letter the same records); one from a lease epoch lower than one seen before is a fenced trainer's
and is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sapo.kafka import ConsumerClient, ConsumerLoop, Disposition, Record, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.sampler import next_sequence_of
from sapo.v1 import policy_pb2
from sapo.wire import (
    DECODE_REASONS,
    POLICY_UPDATE_REASONS,
    InvalidMessageError,
    decode,
    validate_policy_update,
)

log = logging.getLogger(__name__)

TRAINED_REASONS = (*DECODE_REASONS, *POLICY_UPDATE_REASONS, "foreign_node")
"""Every reason `TrainerFollower` refuses an announcement for (counted; it dead-letters nothing)."""

OnTrained = Callable[[int, int], None]
"""Called with (the next sequence the trainer accepts, the version it announced)."""


class TrainerFollower:
    """Reads the node's policy topic with the one consumer loop; see the module docstring."""

    def __init__(
        self,
        client: ConsumerClient,
        topic: str,
        node_id: str,
        on_trained: OnTrained,
        *,
        transport: TransportMetrics,
        stop: StopFlag,
        max_payload_bytes: int,
    ) -> None:
        self._node_id = node_id
        self._on_trained = on_trained
        self._max_bytes = max_payload_bytes
        self._epoch = 0
        self.loop = ConsumerLoop(
            client,
            [topic],
            self._handle,
            stop=stop,
            metrics=transport,
            stream_of=lambda _topic: "policy",
            poll_timeout_s=0.0,
            max_payload_bytes=max_payload_bytes,
        )

    def open(self) -> None:
        self.loop.open()

    def step(self) -> bool:
        """Apply what arrived, without waiting; True when a record was read."""
        return self.loop.step(0.0)

    def close(self) -> None:
        self.loop.close()

    def _handle(self, record: Record) -> Disposition:
        update = decode(policy_pb2.PolicyUpdate, record.value, self._max_bytes)
        reason = validate_policy_update(update)
        if reason is not None:
            raise InvalidMessageError(reason)
        if update.node_id != self._node_id:
            raise InvalidMessageError(
                "foreign_node", f"update for {update.node_id!r} on {self._node_id}'s topic"
            )
        if update.epoch < self._epoch:
            log.info("policy v%d of fenced trainer epoch %d ignored", update.version, update.epoch)
            return Disposition.DONE
        self._epoch = update.epoch
        self._on_trained(next_sequence_of(update), update.version)
        return Disposition.DONE
