"""The training core: a model, its optimizer and schedule, and the state that makes resumption exact.

No Kafka here. `Trainer.apply` turns one `TrainingBatch` into one policy version: rows are built
(`sapo.trainer.sequences`), packed into micro-batches and stepped (`sapo.trainer.step`); a batch with
nothing to train (no groups: a lock-step round without signal, or only failed completions) takes no
optimizer step but still advances the version, so a round-based sampler waiting for it can move on.
Version = number of batches applied (0 = the initial weights).

Delivery semantics, with the service loop around it (`sapo.node.trainer`):

- Input is at-least-once: a batch may be delivered again after a crash or a rebalance.
- The effect is exactly-once. A policy version (`publish`) holds the weights only; a full state
  (`save_state`, every `state_every` versions and on shutdown, beside a published version) holds, in
  `trainer_state.pt`, the optimizer, schedule and RNG states, the next input offset of every batch
  partition, the next expected batch sequence and the ledger version -> batch id. Input offsets are
  committed only after a full state; on start the newest full state is loaded and the consumer is
  positioned at its offsets (the state is the source of truth, the committed offset is advisory), so
  batches trained after it are replayed. The replay re-derives the versions already published under
  the same numbers; `sapo.checkpoints` verifies them and keeps the stored weights should they differ.
- A batch whose id or sequence is in the ledger is a duplicate and is skipped. A sequence above the
  expected one (a batch lost upstream) is trained and counted as a gap; should the batch of a skipped
  sequence arrive after all, it is late: its version was taken by a later batch, so the service refuses
  it (`late_batch`) rather than train it out of order or call it a duplicate.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import IO, cast

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.checkpoints import CheckpointError, CheckpointStore, Published, Written, load_weights
from sapo.digests import Hashing
from sapo.kafka.records import TopicPartition
from sapo.trainer.config import OptimConfig, StepConfig
from sapo.trainer.optim import build_optimizer, current_lr
from sapo.trainer.sequences import BuiltBatch, ExternalLogprobs, SequenceBuilder
from sapo.trainer.state import LedgerEntry, TrainerState, deserialize, serialize
from sapo.trainer.step import StepStats, checkpointed_layers_training, plan_micro_batches, train_on_batch
from sapo.v1 import batch_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepReport:
    """What applying one batch did. `stats` is None when no optimizer step was taken; `intake` is the
    batch's account of what its sampler did per peer, passed on to the step record."""

    version: int
    batch_id: str
    sequence: int
    gap: int
    built: BuiltBatch
    stats: StepStats | None
    lr: float
    seconds: float
    intake: tuple[batch_pb2.PeerIntake, ...] = ()
    cpu_seconds: float = 0.0
    """CPU time of this process during the step (all its threads): with `seconds`, whether the step
    waited for a CPU (a shared host, other services pinned beside it) or ran slower for the same work."""
    quarantined: bool = False
    """The batch was skipped, not trained (`Trainer.skip`): no step happened to time."""


class Trainer:
    """Owns the model being trained; see the module docstring."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_ref: str,
        node_id: str,
        store: CheckpointStore,
        optim: OptimConfig,
        step: StepConfig,
        max_sequence_tokens: int,
        external_logprobs: ExternalLogprobs = "on_policy",
        sampling_temperature: float = 1.0,
        gradient_checkpointing: bool = False,
    ) -> None:
        self.model = model
        self.model_ref = model_ref
        self.node_id = node_id
        self.store = store
        self.step_config = step
        self.builder = SequenceBuilder(
            tokenizer,
            max_sequence_tokens=max_sequence_tokens,
            external_logprobs=external_logprobs,
            sampling_temperature=sampling_temperature,
            vocab_size=int(model.config.vocab_size),
        )
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.builder.eos_token_id
        self.gradient_checkpointing = gradient_checkpointing
        self.share_prompts = not gradient_checkpointing
        """Compute each distinct prompt of a micro-batch once (`sapo.grpo.shared_prompt`). Off under
        gradient checkpointing, which runs without the key/value cache that sharing is built on."""
        if gradient_checkpointing:
            model.activation_checkpointing_enable()
        model.eval()  # type: ignore[no-untyped-call]
        self.optimizer, self.scheduler = build_optimizer(model.parameters(), optim)
        self.state = TrainerState()
        self.state_version = -1
        """Version of the newest full state written or resumed (-1: none yet)."""

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def lr(self) -> float:
        return current_lr(self.optimizer)

    def is_duplicate(self, batch: batch_pb2.TrainingBatch) -> bool:
        """Already applied: its id or its sequence is in the ledger."""
        return self.state.trained(batch.batch_id, int(batch.sequence))

    def is_late(self, batch: batch_pb2.TrainingBatch) -> bool:
        """Below the next expected sequence but never applied: a later batch took its version."""
        return int(batch.sequence) < self.state.next_sequence and not self.is_duplicate(batch)

    def apply(self, batch: batch_pb2.TrainingBatch) -> StepReport:
        """Train on one (non-duplicate) batch and advance the version by one."""
        started, cpu = time.perf_counter(), time.process_time()
        built = self.builder.build(batch, self.state.version)
        stats: StepStats | None = None
        if built.rows:
            micro = plan_micro_batches(
                built.rows,
                self.pad_token_id,
                self.step_config.micro_batch_tokens,
                share_prompts=self.share_prompts,
            )
            layers = (
                checkpointed_layers_training(self.model)
                if self.gradient_checkpointing
                else contextlib.nullcontext()
            )
            with layers:
                stats = train_on_batch(self.model, self.optimizer, self.scheduler, micro, self.step_config)
        gap = int(batch.sequence) - self.state.next_sequence
        self.state.version += 1
        self.state.next_sequence = int(batch.sequence) + 1
        steps = stats.optimizer_steps if stats is not None else 0
        self.state.ledger.append(LedgerEntry(self.state.version, batch.batch_id, int(batch.sequence), steps))
        return StepReport(
            version=self.state.version,
            batch_id=batch.batch_id,
            sequence=int(batch.sequence),
            gap=gap,
            built=built,
            stats=stats,
            lr=self.lr,
            seconds=time.perf_counter() - started,
            intake=tuple(batch.intake),
            cpu_seconds=time.process_time() - cpu,
        )

    def skip(self, batch: batch_pb2.TrainingBatch) -> StepReport:
        """Advance the version past a (non-duplicate) batch without training on it: a quarantined
        batch still ends its round, so lock-step generators get the version they wait for."""
        built = BuiltBatch()
        built.skipped["quarantined"] = sum(len(g.group.completions) for g in batch.groups)
        gap = int(batch.sequence) - self.state.next_sequence
        self.state.version += 1
        self.state.next_sequence = int(batch.sequence) + 1
        self.state.ledger.append(LedgerEntry(self.state.version, batch.batch_id, int(batch.sequence), 0))
        return StepReport(
            version=self.state.version,
            batch_id=batch.batch_id,
            sequence=int(batch.sequence),
            gap=gap,
            built=built,
            stats=None,
            lr=self.lr,
            seconds=0.0,
            intake=tuple(batch.intake),
            quarantined=True,
        )

    def note_offset(self, tp: TopicPartition, next_offset: int) -> None:
        """Record that input up to `next_offset` of `tp` is reflected in the weights."""
        self.state.offsets[tp] = max(next_offset, self.state.offsets.get(tp, 0))

    def restart_offset(self, tp: TopicPartition, offset: int) -> None:
        """Read `tp` again from `offset`: its stored offset belongs to a topic that no longer exists
        (`note_offset` only ever moves forward). The ledger and sequence make the replay harmless."""
        self.state.offsets[tp] = offset

    def publish(self) -> Published:
        """Store the current weights as policy version `version` (weights only). A version replayed
        after a resume is verified against the stored one; should they differ, the stored weights are
        loaded, so a version number keeps the meaning it was announced with."""
        last = self.state.ledger[-1] if self.state.ledger else None
        meta = {
            "batch_id": last.batch_id if last else "",
            "sequence": last.sequence if last else -1,
            "tokenizer_fingerprint": self.builder.fingerprint,
        }
        published = self.store.publish(
            self.node_id, self.state.version, self.model.state_dict(), base_model=self.model_ref, meta=meta
        )
        if published.outcome == "diverged" and published.written is not None:
            log.warning(
                "replayed version %d differs from the stored one (non-deterministic training?): "
                "continuing from the stored weights",
                self.state.version,
            )
            stored = published.written
            self.model.load_state_dict(load_weights(stored.manifest, stored.directory), strict=True)
        return published

    def save_state(self) -> bool:
        """Write the full state beside the current (published) version; False if it had one."""

        def write(out: Hashing) -> None:
            serialize(self.state, self.optimizer, self.scheduler, cast(IO[bytes], out))

        saved = self.store.save_state(self.node_id, self.state.version, write)
        self.state_version = self.state.version
        return saved

    def checkpoint(self) -> Written:
        """Publish the current weights and write the full state beside them."""
        published = self.publish()
        if published.written is None:
            raise CheckpointError(
                "exists", f"version {self.state.version} is older than the newest stored one: no state there"
            )
        self.save_state()
        return published.written

    def restore(self) -> Written | None:
        """Load the newest full state of this node (weights, optimizer, schedule, RNG, state), if any."""
        loaded = self.store.load_state(self.node_id)
        if loaded is None:
            return None
        written, data = loaded
        if written.manifest.base_model != self.model_ref:
            raise CheckpointError(
                "base_model_mismatch",
                f"the checkpoints under {self.store.node_dir(self.node_id).uri()} were trained from "
                f"{written.manifest.base_model!r}, not {self.model_ref!r}: set the model to "
                f"{written.manifest.base_model!r} or point the checkpoint root at a fresh location",
            )
        self.model.load_state_dict(load_weights(written.manifest, written.directory), strict=True)
        self.state = deserialize(data, self.optimizer, self.scheduler)
        self.state_version = self.state.version
        log.info("resumed %s at version %d from %s", self.node_id, self.state.version, written.manifest_uri)
        return written

    def initialize(self) -> tuple[Written, bool]:
        """Resume from the newest full state, or write version 0 (the initial weights) with a state, so
        generators have something to load. Returns the version to announce and whether it resumed."""
        self.store.remove_partial(self.node_id)  # what a trainer killed mid-write left behind
        restored = self.restore()
        if restored is not None:
            return restored, True
        return self.checkpoint(), False
