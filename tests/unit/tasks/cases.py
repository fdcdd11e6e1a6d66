"""Shared cases for the task tests: every task of both built-in profiles, and records drawn from them."""

from __future__ import annotations

import pytest

from sapo.tasks import PROFILES, QuestionRecord, Split, TaskSpec, TaskStream

ALL_SPECS = [
    pytest.param(spec, id=f"{profile}-{spec.name}") for profile, specs in PROFILES.items() for spec in specs
]
"""One case per (profile, task): 9 paper tasks and 4 easy ones."""


def records_of(
    spec: TaskSpec, count: int, split: Split = "train", node_seed: int = 0
) -> list[QuestionRecord]:
    """The first `count` records of a single-task stream."""
    return TaskStream((spec,), node_seed, split).take(count)
