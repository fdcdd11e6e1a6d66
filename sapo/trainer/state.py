"""The trainer's resumable state and its serialized form, `trainer_state.pt`, stored beside a version.

A checkpoint must hold everything that makes the next step identical to the one an uninterrupted run
would take: optimizer moments, the schedule's position, RNG states, the policy version, the next input
offset of every batch partition, the next expected batch sequence and the ledger (version -> batch id)
that proves no batch was trained twice or skipped. The file is a plain `torch.save` of tensors,
numbers, strings, lists and dicts, read back with `weights_only=True`: a checkpoint store shared with
other processes must not be able to run code in the trainer. It is written every `state_every`
versions and on shutdown (`sapo.checkpoints`); input offsets are committed only with it.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field
from typing import IO, Any

import torch

from sapo.checkpoints import TRAINER_STATE
from sapo.kafka.records import TopicPartition

FORMAT = 1


@dataclass(frozen=True)
class LedgerEntry:
    """Batch `batch_id` (sequence `sequence`) produced policy `version` with `optimizer_steps` updates
    (0 for an empty batch, which advances the version without an update)."""

    version: int
    batch_id: str
    sequence: int
    optimizer_steps: int


@dataclass
class TrainerState:
    """Where training stands; `offsets` maps each batch partition to the next offset to read."""

    version: int = 0
    next_sequence: int = 0
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    ledger: list[LedgerEntry] = field(default_factory=list)

    def trained(self, batch_id: str, sequence: int) -> bool:
        """Whether a batch with this id or this sequence produced a version."""
        return any(entry.batch_id == batch_id or entry.sequence == sequence for entry in self.ledger)


def capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def serialize(
    state: TrainerState,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    out: IO[bytes],
) -> None:
    """Write the state to `out` (streamed: the optimizer state of a large model is never held twice)."""
    payload = {
        "format": FORMAT,
        "version": state.version,
        "next_sequence": state.next_sequence,
        "offsets": [[topic, partition, offset] for (topic, partition), offset in state.offsets.items()],
        "ledger": [[e.version, e.batch_id, e.sequence, e.optimizer_steps] for e in state.ledger],
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": capture_rng(),
    }
    torch.save(payload, out)


def deserialize(
    data: bytes,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> TrainerState:
    """Load optimizer, schedule and RNG states in place and return the trainer state."""
    payload = torch.load(io.BytesIO(data), weights_only=True)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{TRAINER_STATE} has format {payload.get('format')!r}; this trainer reads {FORMAT}")
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    restore_rng(payload["rng"])
    return TrainerState(
        version=int(payload["version"]),
        next_sequence=int(payload["next_sequence"]),
        offsets={(str(t), int(p)): int(o) for t, p, o in payload["offsets"]},
        ledger=[LedgerEntry(int(v), str(b), int(s), int(n)) for v, b, s, n in payload["ledger"]],
    )
