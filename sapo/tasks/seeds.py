"""Stable seed derivation and the disjoint seed ranges that keep train, eval and prompt examples apart.

reasoning-gym generates item i of a dataset with seed s from `random.Random(s + i)`. Two dataset
instances therefore share items whenever their windows [s, s + size) overlap. Each purpose (train, eval,
prompt example) owns a 2**62-wide range of seeds, and a seed is placed so that its whole index window
stays inside its range: no training item can be generated from the RNG state of an eval item, on any
node, whatever the node seeds. Seeds come from sha256, never from Python's salted `hash()`.

Disjoint RNG states do not make disjoint texts: tasks with small question spaces (two-premise
propositional logic, leap years) repeat questions. So the question text is partitioned too: a split only
accepts texts whose stable hash falls on its side (`text_in_split`), and eval never shares a text with
training, on any node.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from sapo.tasks.records import Split

Purpose = Literal["train", "eval", "example", "choice"]

DATASET_SIZE = 2**32
"""Virtual size of every dataset instance: indices run over [0, DATASET_SIZE)."""

_RANGE_WIDTH = 2**62
_RANGE_BASE: dict[Purpose, int] = {
    "train": 0,
    "eval": _RANGE_WIDTH,
    "example": 2 * _RANGE_WIDTH,
    "choice": 3 * _RANGE_WIDTH,
}


def stable_hash(*parts: str | int) -> int:
    """A 64-bit hash of the parts that is identical on every machine and Python process."""
    payload = "\x1f".join(str(part) for part in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(b"sapo.tasks/v1\x1e" + payload).digest()[:8], "big")


def derive_seed(purpose: Purpose, task: str, key: str | int) -> int:
    """Dataset seed for `task` in the range of `purpose`, keyed by a node seed or a config digest.

    The result s satisfies s + index < base + 2**62 for every index < DATASET_SIZE, so windows of
    different purposes can never overlap. It fits the proto's uint64.
    """
    span = _RANGE_WIDTH - DATASET_SIZE
    return _RANGE_BASE[purpose] + stable_hash(purpose, task, key) % span


def seed_in_split(seed: int, split: Split) -> bool:
    """Whether `seed` lies in the range reserved for `split` (a cheap check of a sender's claim)."""
    base = _RANGE_BASE[split]
    return base <= seed < base + _RANGE_WIDTH - DATASET_SIZE


def text_in_split(text: str, split: Split) -> bool:
    """Whether a question text belongs to `split`'s half of the text space (train even, eval odd)."""
    return stable_hash("text", text) % 2 == (0 if split == "train" else 1)
