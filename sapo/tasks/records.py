"""Plain-data mirrors of the wire `Question` and `Provenance` (proto/sapo/v1/question.proto).

The task package works on these frozen dataclasses so that streams, verification, prompts and rewards
stay free of protobuf; the wire codec converts at the edge. `metadata` is always the JSON-normalised
form (tuples become lists), so a record built locally equals the same record after a trip over the wire.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")


def canonical_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no whitespace): the exact bytes a config digest is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    """Lower-case hex sha256 of UTF-8 text, as carried in `Provenance.config_digest`."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def json_normalized(value: dict[str, Any]) -> dict[str, Any]:
    """The value as a receiver sees it after JSON encoding: lists for tuples, string keys."""
    normalized: dict[str, Any] = json.loads(json.dumps(value))
    return normalized


@dataclass(frozen=True)
class Provenance:
    """How to re-derive a question: dataset `dataset` built from `config_json` and `seed`, item `index`."""

    dataset: str
    config_json: str
    config_digest: str
    seed: int
    index: int
    generator_version: str
    split: Split


@dataclass(frozen=True)
class QuestionRecord:
    """One verifiable task instance: question text, ground-truth answer, verifier metadata, provenance.

    `answer` is the reference answer that the dataset's own verifier scores 1.0 (for datasets without a
    single oracle answer, such as propositional_logic, it is the generator's example answer).
    """

    task: str
    text: str
    answer: str
    metadata: dict[str, Any] = field(hash=False)
    provenance: Provenance

    @property
    def metadata_json(self) -> str:
        """Metadata as the wire carries it (`Question.metadata_json`)."""
        return canonical_json(self.metadata)
