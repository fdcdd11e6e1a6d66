"""Two broken trainers the conformance kit must fail (`python -m tests.conformance.broken_trainer MODE`):

- `twice`: trains a re-delivered batch again (contract section 9.2), as a trainer without a ledger would.
- `no-checkpoint`: announces versions whose checkpoint was never written (section 9.3).
"""

from __future__ import annotations

import dataclasses
import sys

from sapo.checkpoints import Written
from sapo.node.trainer import TrainerService
from sapo.runtime import configure, serve
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2


class TwiceTrainer(TrainerService):
    def start(self) -> None:
        super().start()

        def never(_batch: batch_pb2.TrainingBatch) -> bool:
            return False

        # Neither a duplicate nor late: a re-delivered batch is trained again.
        self.trainer.is_duplicate = never  # type: ignore[method-assign,assignment]
        self.trainer.is_late = never  # type: ignore[method-assign,assignment]


class UncheckpointedTrainer(TrainerService):
    def _announce(self, written: Written) -> None:
        if written.manifest.version > 0:  # announce where nothing was written
            missing = written.manifest_uri.replace("/manifest.json", "-unwritten/manifest.json")
            written = dataclasses.replace(written, manifest_uri=missing)
        super()._announce(written)


if __name__ == "__main__":
    broken = {"twice": TwiceTrainer, "no-checkpoint": UncheckpointedTrainer}[sys.argv[1]]
    raise SystemExit(serve("trainer", configure("trainer", TrainerSettings, argv=[]), broken.prepare))
