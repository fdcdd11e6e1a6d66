"""Re-deriving a question from its provenance, so a receiver never trusts a sender's answer.

A sampler calls `verify_question` on every external group (docs/architecture.md): the question is rebuilt
from (dataset, config_json, seed, index) and must match the sender's text, answer and metadata exactly.
Rejections are short, bounded reason labels, safe to use as metric labels.
"""

from __future__ import annotations

from collections.abc import Callable

from sapo.tasks.datasets import GENERATOR_VERSION, UNSAFE_VERIFIERS, generate_record, is_known_dataset
from sapo.tasks.records import SPLITS, Provenance, QuestionRecord, sha256_hex
from sapo.tasks.seeds import DATASET_SIZE, seed_in_split, text_in_split

REJECTION_REASONS = (
    "unknown_dataset",
    "unsafe_verifier",
    "config_digest_mismatch",
    "generator_version_mismatch",
    "split_mismatch",
    "index_out_of_range",
    "invalid_config",
    "task_mismatch",
    "question_mismatch",
    "answer_mismatch",
    "metadata_mismatch",
)
"""Every reason `verify_question` can return (for initialising metric labels up front)."""


class RederivationError(ValueError):
    """Provenance that cannot be re-derived; `reason` is one of REJECTION_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def rederive(provenance: Provenance) -> QuestionRecord:
    """The record the provenance describes, generated locally. Raises RederivationError."""
    reason = provenance_problem(provenance)
    if reason is not None:
        raise RederivationError(reason)
    try:
        return generate_record(
            provenance.dataset, provenance.config_json, provenance.seed, provenance.index, provenance.split
        )
    except Exception as exc:  # the config came off the wire: anything the generator refuses is a rejection
        raise RederivationError("invalid_config", f"{type(exc).__name__}: {exc}") from exc


def provenance_problem(provenance: Provenance) -> str | None:
    """The first reason the provenance cannot be trusted before generating anything, or None.

    An empty generator_version (unknown) is let through: the item comparison decides. The seed must lie
    in the range of the claimed split, so nobody can pass an eval item off as a training one.
    """
    if not is_known_dataset(provenance.dataset):
        return "unknown_dataset"
    if provenance.dataset in UNSAFE_VERIFIERS:
        return "unsafe_verifier"
    if sha256_hex(provenance.config_json) != provenance.config_digest:
        return "config_digest_mismatch"
    if provenance.generator_version and provenance.generator_version != GENERATOR_VERSION:
        return "generator_version_mismatch"
    if provenance.split not in SPLITS or not seed_in_split(provenance.seed, provenance.split):
        return "split_mismatch"
    if not 0 <= provenance.index < DATASET_SIZE:
        return "index_out_of_range"
    return None


def verify_question(
    record: QuestionRecord, derive: Callable[[Provenance], QuestionRecord] = rederive
) -> str | None:
    """None if the record is exactly what its provenance re-derives to, else a short reason.

    The text must also lie in its split's half of the text space, so a peer cannot pass an eval question
    (or one no stream would ever draw for that split) off as training data. `derive` is `rederive` or
    one that caches it (`sapo.sampler.verifier`).
    """
    try:
        expected = derive(record.provenance)
    except RederivationError as exc:
        return exc.reason
    if record.task != expected.task:
        return "task_mismatch"
    if record.text != expected.text:
        return "question_mismatch"
    if record.answer != expected.answer:
        return "answer_mismatch"
    if record.metadata != expected.metadata:
        return "metadata_mismatch"
    if not text_in_split(expected.text, expected.provenance.split):
        return "split_mismatch"
    return None
