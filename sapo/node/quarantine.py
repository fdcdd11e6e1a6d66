"""Poison batches: a batch whose step keeps failing is set aside instead of stopping the trainer forever.

A step can fail in ways no validation foresees (out of memory on one long batch, a tokenizer edge
case). Such a failure stops the trainer (it must not go on with half-updated weights), and its restart
reads the same batch again: without a limit the node would crash on it forever. So before each step
the trainer writes an *attempt record* beside its checkpoints (`<store>/<node>/attempt.json`: batch
id and sequence, attempts so far, the last error), and a step that fails in-process records its error
there before the process stops; a step that succeeds rewrites it as `stepped` (no failed attempts).
It survives what kills the process outright (the kernel's OOM killer, SIGKILL): a death during the
step counts as an attempt, one after it does not, however many restarts replay the batch before a
full state covers it. A restart replays the batches since the last full state before it reaches the
failing one again: a batch of a lower sequence than the record's was stepped past before, so its
replay leaves the record alone, and the failing batch's next attempt is counted on top of the last.

When a batch arrives whose attempt record already counts `max_step_attempts` attempts, it is not tried
again: it is dead-lettered with reason `poison_batch` and the last error, counted
(`sapo_trainer_batches_total{outcome="quarantined"}`, alerted on by `SapoTrainerPoisonBatch`), and the
version advances without training (`Trainer.skip`), so lock-step generators still get their round's
version. One record per node is enough: batches are trained in sequence order, one at a time, and the
next batch's first attempt overwrites it (two small writes per step).

What fails after a successful step is not the batch's fault: when the checkpoint store refuses the
version or state that follows (full, read-only, unreachable), the trainer stops too, and each restart
replays the same batch. Its record says `stepped`, so the store's outage, however many restarts it
lasts, never quarantines a batch that trains.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from sapo import storage
from sapo.checkpoints import CheckpointError
from sapo.storage import Location

log = logging.getLogger(__name__)

RECORD = "attempt.json"
MAX_ERROR = 2000


@dataclass(frozen=True)
class Attempt:
    """How often the step of `batch_id` was started, and how the last one failed ("" = unknown: the
    process died without saying)."""

    batch_id: str
    sequence: int
    attempts: int
    error: str = ""


def next_attempt(previous: Attempt | None, batch_id: str, sequence: int) -> Attempt | None:
    """The record to write before stepping `batch_id` (at `sequence`), or None for the replay of a
    batch stepped past before (the record is left alone)."""
    if previous is None or sequence > previous.sequence:
        return Attempt(batch_id, sequence, 1)
    if sequence < previous.sequence:
        return None
    if previous.batch_id == batch_id:
        return Attempt(batch_id, sequence, previous.attempts + 1, previous.error)
    return Attempt(batch_id, sequence, 1)  # another batch of the same sequence: a new sampler's


def stepped(attempt: Attempt) -> Attempt:
    """The record of `attempt`'s batch once its step has succeeded: no failed attempts left to count."""
    return Attempt(attempt.batch_id, attempt.sequence, 0)


def is_poison(previous: Attempt | None, batch_id: str, max_attempts: int) -> bool:
    """Whether `batch_id` has already been tried `max_attempts` times without success."""
    return previous is not None and previous.batch_id == batch_id and previous.attempts >= max_attempts


class AttemptLog:
    """The node's attempt record in its checkpoint store; see the module docstring."""

    def __init__(self, node_dir: Location, digest: str) -> None:
        self._dir = node_dir
        self._digest = digest

    def read(self) -> Attempt | None:
        """The record, or None when there is none or it cannot be parsed (counted as no attempt)."""
        try:
            body = json.loads(storage.read_bytes(self._dir / RECORD))
            return Attempt(
                str(body["batch_id"]),
                int(body["sequence"]),
                int(body["attempts"]),
                str(body.get("error", "")),
            )
        except CheckpointError as exc:
            if exc.reason != "missing":
                raise
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable %s in %s: counted as no attempt", RECORD, self._dir.uri())
            return None

    def write(self, attempt: Attempt) -> None:
        body = {
            "batch_id": attempt.batch_id,
            "sequence": attempt.sequence,
            "attempts": attempt.attempts,
            "error": attempt.error[:MAX_ERROR],
        }
        data = json.dumps(body).encode()
        storage.write_file(self._dir, RECORD, lambda sink: sink.write(data), self._digest)
