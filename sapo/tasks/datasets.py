"""Building reasoning-gym datasets and turning their items into `QuestionRecord`s.

Every reasoning-gym dataset used here generates item i from `random.Random(seed + i)` alone
(`ProceduralDataset.__getitem__`), so a dataset instance with a huge virtual size costs nothing to build
and any index can be produced without generating the ones before it. Instances are cached in a bounded
LRU keyed by (dataset, config_json, seed): the stream, re-derivation and scoring all hit the same entry.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
from typing import Any

from reasoning_gym.factory import DATASETS

from sapo.tasks.records import Provenance, QuestionRecord, Split, json_normalized, sha256_hex
from sapo.tasks.seeds import DATASET_SIZE

GENERATOR_VERSION = f"reasoning-gym {importlib.metadata.version('reasoning-gym')}"
"""Carried in every provenance; a receiver on another version may derive different items."""

DATASET_CACHE_SIZE = 1024
"""Dataset instances kept: nodes x tasks x splits, plus prompt examples, with room to spare."""

UNSAFE_VERIFIERS = frozenset(
    {
        "countdown",
        "intermediate_integration",
        "n_queens",
        "polynomial_multiplication",
        "puzzle24",
        "simple_integration",
        "spiral_matrix",
        "string_insertion",
    }
)
"""Datasets whose `score_answer` runs model text through `eval` or sympy's `parse_expr`.

A peer's completion reaches our verifier, so these would let any peer run code on this node. They are
refused in profiles and never scored (audit of reasoning-gym 0.1.25; binary_matrix also evals, but is
scored by a literal-only reimplementation in `sapo.tasks.reward`).
"""


def is_known_dataset(name: str) -> bool:
    """Whether reasoning-gym has a dataset registered under `name`."""
    return name in DATASETS


@functools.lru_cache(maxsize=DATASET_CACHE_SIZE)
def dataset_instance(dataset: str, config_json: str, seed: int) -> Any:
    """The dataset built from canonical config JSON and a seed (virtual size DATASET_SIZE), cached.

    Raises KeyError for an unknown dataset, and TypeError/ValueError/AssertionError for a config the
    dataset's config class or `validate()` refuses.
    """
    dataset_cls, config_cls = DATASETS[dataset]
    config = config_cls(**json.loads(config_json), seed=seed, size=DATASET_SIZE)
    return dataset_cls(config)


def generate_entry(dataset: str, config_json: str, seed: int, index: int) -> dict[str, Any]:
    """The raw reasoning-gym entry (question, answer, metadata) at `index`.

    Standard output is swallowed while generating: bf's compiler prints a progress dot per item, which
    would corrupt a service's log stream. (This swaps the process-wide sys.stdout for the call; logging
    handlers keep their own stream reference and are unaffected.)
    """
    instance = dataset_instance(dataset, config_json, seed)
    with contextlib.redirect_stdout(io.StringIO()):
        entry: dict[str, Any] = instance[index]
    return entry


def reference_answer(entry: dict[str, Any]) -> str:
    """The answer the verifier should score 1.0: the oracle answer, else the generator's example answer.

    propositional_logic has no single oracle (answer None) but ships a valid conclusion as
    metadata["example_answer"]. Datasets with neither yield "", which the stream's self-check rejects.
    """
    answer = entry.get("answer")
    if isinstance(answer, str):
        return answer
    example = entry.get("metadata", {}).get("example_answer")
    return example if isinstance(example, str) else ""


def generate_record(dataset: str, config_json: str, seed: int, index: int, split: Split) -> QuestionRecord:
    """The item at `index` of the dataset (config_json, seed) as a record with full provenance."""
    entry = generate_entry(dataset, config_json, seed, index)
    provenance = Provenance(
        dataset=dataset,
        config_json=config_json,
        config_digest=sha256_hex(config_json),
        seed=seed,
        index=index,
        generator_version=GENERATOR_VERSION,
        split=split,
    )
    return QuestionRecord(
        task=dataset,
        text=entry["question"],
        answer=reference_answer(entry),
        metadata=json_normalized(entry.get("metadata", {})),
        provenance=provenance,
    )
