"""The training core, without Kafka: batches -> rows -> GRPO steps -> versioned, resumable checkpoints.

- `config`: `OptimConfig` and `StepConfig`, plain data that `TrainerSettings` builds (no torch).
- `sequences`: rows from a TrainingBatch (as sampled vs re-tokenized) and where each row's pi_old comes from.
- `step`: micro-batching, pi_old per row mode, the optimizer step(s) of one batch.
- `optim`: AdamW and its warmup / constant / cosine schedule.
- `state`: the resumable state (`trainer_state.pt`, every `state_every` versions): optimizer, schedule, RNG,
  offsets, ledger.
- `engine`: `Trainer`, which ties them together and documents the delivery semantics.
- `contributions`: per source node, the groups, tokens and advantage mass a step trained on (the function
  `contributions` is imported from that module: the package's attribute of that name is the module).
- `report`: `step_metrics`, the wire summary of a step (what a `PolicyUpdate` announces).
- `settings`: `TrainerSettings`, the service's settings (imported from there, not from this package).

The names below are imported on first use (`sapo.lazy`): most modules load torch, the settings must not.
"""

from typing import TYPE_CHECKING

from sapo.lazy import lazy_exports

if TYPE_CHECKING:
    from sapo.checkpoints import TRAINER_STATE
    from sapo.trainer.config import OptimConfig, Precision, Schedule, StepConfig
    from sapo.trainer.contributions import Contribution
    from sapo.trainer.engine import StepReport, Trainer
    from sapo.trainer.optim import lr_factor
    from sapo.trainer.report import step_metrics
    from sapo.trainer.sequences import BuiltBatch, ExternalLogprobs, Row, RowMode, SequenceBuilder
    from sapo.trainer.state import LedgerEntry, TrainerState
    from sapo.trainer.step import MicroBatch, StepStats, plan_micro_batches, train_on_batch
else:
    __getattr__ = lazy_exports(
        __name__,
        {
            "sapo.checkpoints": ("TRAINER_STATE",),
            "sapo.trainer.config": ("OptimConfig", "Precision", "Schedule", "StepConfig"),
            "sapo.trainer.contributions": ("Contribution",),
            "sapo.trainer.engine": ("StepReport", "Trainer"),
            "sapo.trainer.optim": ("lr_factor",),
            "sapo.trainer.report": ("step_metrics",),
            "sapo.trainer.sequences": ("BuiltBatch", "ExternalLogprobs", "Row", "RowMode", "SequenceBuilder"),
            "sapo.trainer.state": ("LedgerEntry", "TrainerState"),
            "sapo.trainer.step": ("MicroBatch", "StepStats", "plan_micro_batches", "train_on_batch"),
        },
    )

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
    "lr_factor",
    "plan_micro_batches",
    "step_metrics",
    "train_on_batch",
]
