"""Per-node question streams: reproducible, different on every node, with a held-out eval split.

The public reference code gave every node the same question stream. Here the dataset seed of each task
is derived from (node seed, task, split) with sha256, and the split picks a disjoint seed range
(`sapo.tasks.seeds`), so eval items are never generated from a training item's RNG state on any node.

The stream is random-access: record k depends only on (profile, node seed, split, k). Position k draws
its task from `Random(choice_seed + k)` by weight, with replacement, and uses dataset indices
k * ATTEMPTS_PER_POSITION + attempt. An item is skipped, by taking the next attempt, when its text lies
in the other split's half of the text space (about half of all items), or when its own verifier does not
score its reference answer 1.0 (reasoning-gym produces a few: base_conversion of 0 has the answer "",
some propositional_logic example answers are not valid conclusions). A restarted node
resumes with `start=` its saved position instead of replaying its first questions.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from sapo.tasks.datasets import generate_record
from sapo.tasks.profiles import Profile, provenance_config, validate_profile
from sapo.tasks.records import QuestionRecord, Split
from sapo.tasks.reward import reference_reward
from sapo.tasks.seeds import DATASET_SIZE, derive_seed, text_in_split

ATTEMPTS_PER_POSITION = 64
"""Dataset indices reserved per stream position for skipped items (all 64 failing: p ~ 2**-64)."""

MAX_POSITION = DATASET_SIZE // ATTEMPTS_PER_POSITION
"""Positions a stream can address (2**26 questions)."""


class UnscorableTaskError(RuntimeError):
    """A task whose items its own verifier does not reward for their reference answer."""


@dataclass(frozen=True)
class _StreamTask:
    """A task of the stream, resolved: its canonical config JSON and this stream's dataset seed."""

    name: str
    config_json: str
    seed: int


def first_scorable(
    task: str, config_json: str, seed: int, first_index: int, split: Split, *, attempts: int
) -> QuestionRecord:
    """The first item from `first_index` on with a text in `split` and a reference answer scoring 1.0."""
    for index in range(first_index, first_index + attempts):
        record = generate_record(task, config_json, seed, index, split)
        if text_in_split(record.text, split) and reference_reward(record) == 1.0:
            return record
    raise UnscorableTaskError(
        f"task {task!r} produced {attempts} unusable items in a row (in the other split's text half, or "
        "with a reference answer its own verifier does not score 1.0: no single oracle answer?); "
        "remove it from the profile"
    )


class TaskStream(Iterator[QuestionRecord]):
    """An endless, reproducible stream of questions for one node and split.

    Same (profile, node_seed, split) gives the same records; different node seeds give different ones.
    For a swarm-wide held-out set, give every node the same eval `node_seed`.
    """

    def __init__(self, profile: Profile, node_seed: int, split: Split, start: int = 0) -> None:
        validate_profile(profile)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.split: Split = split
        self.position = start
        self._tasks = tuple(
            _StreamTask(spec.name, provenance_config(spec), derive_seed(split, spec.name, node_seed))
            for spec in profile
        )
        self._cum_weights = list(itertools.accumulate(float(spec.weight) for spec in profile))
        self._choice_seed = derive_seed("choice", split, node_seed)

    def __iter__(self) -> TaskStream:
        return self

    def __next__(self) -> QuestionRecord:
        record = self.record_at(self.position)
        self.position += 1
        return record

    def take(self, count: int) -> list[QuestionRecord]:
        """The next `count` records (a round's questions)."""
        return [next(self) for _ in range(count)]

    def record_at(self, position: int) -> QuestionRecord:
        """Record number `position` of this stream, without moving the stream."""
        if not 0 <= position < MAX_POSITION:
            raise IndexError(f"stream position {position} outside [0, {MAX_POSITION})")
        rng = random.Random(self._choice_seed + position)
        task = rng.choices(self._tasks, cum_weights=self._cum_weights)[0]
        return first_scorable(
            task.name,
            task.config_json,
            task.seed,
            position * ATTEMPTS_PER_POSITION,
            self.split,
            attempts=ATTEMPTS_PER_POSITION,
        )
