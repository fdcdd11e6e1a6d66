"""The training core, without Kafka: batches -> rows -> GRPO steps -> versioned, resumable checkpoints.

- `sequences`: rows from a TrainingBatch (as sampled vs re-tokenized) and where each row's pi_old comes from.
- `step`: micro-batching, pi_old per row mode, the optimizer step(s) of one batch.
- `optim`: AdamW and its warmup / constant / cosine schedule.
- `state`: the resumable state (`trainer_state.pt`, every `state_every` versions): optimizer, schedule, RNG,
  offsets, ledger.
- `engine`: `Trainer`, which ties them together and documents the delivery semantics.
- `contributions`: per source node, the groups, tokens and advantage mass a step trained on.
- `report`: `step_metrics`, the wire summary of a step (what a `PolicyUpdate` announces).
"""

from sapo.checkpoints import TRAINER_STATE
from sapo.trainer.contributions import Contribution, contributions
from sapo.trainer.engine import StepReport, Trainer
from sapo.trainer.optim import OptimConfig, Schedule, lr_factor
from sapo.trainer.report import step_metrics
from sapo.trainer.sequences import BuiltBatch, ExternalLogprobs, Row, RowMode, SequenceBuilder
from sapo.trainer.state import LedgerEntry, TrainerState
from sapo.trainer.step import MicroBatch, Precision, StepConfig, StepStats, plan_micro_batches, train_on_batch

__all__ = [
    "TRAINER_STATE",
    "BuiltBatch",
    "Contribution",
    "ExternalLogprobs",
    "LedgerEntry",
    "MicroBatch",
    "OptimConfig",
    "Precision",
    "Row",
    "RowMode",
    "Schedule",
    "SequenceBuilder",
    "StepConfig",
    "StepReport",
    "StepStats",
    "Trainer",
    "TrainerState",
    "contributions",
    "lr_factor",
    "plan_micro_batches",
    "step_metrics",
    "train_on_batch",
]
