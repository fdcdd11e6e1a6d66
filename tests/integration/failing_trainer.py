"""The trainer service with a step that fails on one batch (`python -m tests.integration.failing_trainer
SEQUENCE`): what the poison-batch quarantine exists for is a step that fails on a batch every message
check passed (a bug no check names), so the test brings one about on purpose."""

from __future__ import annotations

import sys

from sapo.node.trainer import REFUSALS, TrainerService
from sapo.runtime import configure, serve
from sapo.trainer.engine import StepReport
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2

FAILING = int(sys.argv[1]) if __name__ == "__main__" else -1


class FailingStepTrainer(TrainerService):
    def start(self) -> None:
        super().start()
        apply = self.trainer.apply

        def failing(batch: batch_pb2.TrainingBatch) -> StepReport:
            if batch.sequence == FAILING:
                raise RuntimeError(f"injected failure of the step of sequence {FAILING}")
            return apply(batch)

        self.trainer.apply = failing  # type: ignore[method-assign]


if __name__ == "__main__":
    raise SystemExit(
        serve("trainer", configure("trainer", TrainerSettings, argv=[]), FailingStepTrainer.prepare, REFUSALS)
    )
