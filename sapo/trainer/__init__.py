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
    from sapo.checkpoints import TRAINER_STATE as TRAINER_STATE
    from sapo.trainer.config import OptimConfig as OptimConfig
    from sapo.trainer.config import Precision as Precision
    from sapo.trainer.config import Schedule as Schedule
    from sapo.trainer.config import StepConfig as StepConfig
    from sapo.trainer.contributions import Contribution as Contribution
    from sapo.trainer.engine import StepReport as StepReport
    from sapo.trainer.engine import Trainer as Trainer
    from sapo.trainer.optim import lr_factor as lr_factor
    from sapo.trainer.report import step_metrics as step_metrics
    from sapo.trainer.sequences import BuiltBatch as BuiltBatch
    from sapo.trainer.sequences import ExternalLogprobs as ExternalLogprobs
    from sapo.trainer.sequences import Row as Row
    from sapo.trainer.sequences import RowMode as RowMode
    from sapo.trainer.sequences import SequenceBuilder as SequenceBuilder
    from sapo.trainer.state import LedgerEntry as LedgerEntry
    from sapo.trainer.state import TrainerState as TrainerState
    from sapo.trainer.step import MicroBatch as MicroBatch
    from sapo.trainer.step import StepStats as StepStats
    from sapo.trainer.step import plan_micro_batches as plan_micro_batches
    from sapo.trainer.step import train_on_batch as train_on_batch
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__)
