"""Broken trainers the conformance kit must fail (`python -m tests.conformance.broken_trainer MODE`):

- `twice`: trains a re-delivered batch again (contract section 9.2), as a trainer that looks a batch up
  in its ledger only to tell whether it is late would.
- `no-checkpoint`: announces versions whose checkpoint was never written (section 9.3).
- `early-commit`: commits a batch as it arrives, before the version that trains it is announced
  (section 5.4), as a trainer with auto-commit would.
- `no-epochs`: finds no sampler epoch on the leases topic and so refuses every batch as
  `epoch_beyond_leases` (section 6), as a trainer reading the wrong leases topic would.
- `any-epoch`: takes every epoch for one a lease gave, and so trains a batch of an epoch beyond the
  leases topic's end (section 6), as a trainer that only fences lower epochs would.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from sapo.checkpoints import Written
from sapo.kafka import Record
from sapo.kafka.consumer import Disposition
from sapo.node.trainer import REFUSALS, TrainerService
from sapo.runtime import configure, serve
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2


class TwiceTrainer(TrainerService):
    def start(self) -> None:
        super().start()
        trainer = self.trainer

        def never(_batch: batch_pb2.TrainingBatch) -> bool:
            return False

        def late(batch: batch_pb2.TrainingBatch) -> bool:
            state = trainer.state
            return batch.sequence < state.next_sequence and not state.trained(batch.batch_id, batch.sequence)

        # A re-delivered batch is neither a duplicate nor late, and is trained again; a late one is late.
        self.trainer.is_duplicate = never  # type: ignore[method-assign,assignment]
        self.trainer.is_late = late  # type: ignore[method-assign]


class UncheckpointedTrainer(TrainerService):
    def _announce(self, written: Written) -> None:
        if written.manifest.version > 0:  # announce where nothing was written
            missing = written.manifest_uri.replace("/manifest.json", "-unwritten/manifest.json")
            written = dataclasses.replace(written, manifest_uri=missing)
        super()._announce(written)


class EarlyCommitTrainer(TrainerService):
    COMMITTED_FOR_S = 3.0
    """How long the first batch stays committed before its version is announced: longer than the kit's
    observations of the committed offset are apart. Later batches are committed as early, unheld: the
    kit names the first early commit it sees, and most of its batches are refused anyway."""

    def handle(self, record: Record) -> Disposition:
        client = self.loop._client  # behind the loop's back: the loop commits only finished records
        client.store([(record.topic, record.partition, record.offset + 1)])
        client.commit()
        if record.offset == 0:
            time.sleep(self.COMMITTED_FOR_S)
        return super().handle(record)


class _FixedEpochTrainer(TrainerService):
    """Judges every batch's sampler epoch alike, whatever the leases topic says."""

    VOUCHES: bool

    def start(self) -> None:
        super().start()
        assert self.lease is not None
        answer = self.VOUCHES

        def vouches(_epoch: int) -> bool:
            return answer

        self.lease.vouches = vouches  # type: ignore[method-assign,assignment]


class EpochlessTrainer(_FixedEpochTrainer):
    VOUCHES = False


class AnyEpochTrainer(_FixedEpochTrainer):
    VOUCHES = True


if __name__ == "__main__":
    broken = {
        "twice": TwiceTrainer,
        "no-checkpoint": UncheckpointedTrainer,
        "early-commit": EarlyCommitTrainer,
        "no-epochs": EpochlessTrainer,
        "any-epoch": AnyEpochTrainer,
    }[sys.argv[1]]
    raise SystemExit(
        serve("trainer", configure("trainer", TrainerSettings, argv=[]), broken.prepare, REFUSALS)
    )
