"""Re-derivation from provenance: honest records round-trip, tampered ones are rejected by reason."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest

from sapo.tasks import PAPER_PROFILE, REJECTION_REASONS, QuestionRecord, TaskSpec, rederive, verify_question
from sapo.tasks.datasets import generate_record
from sapo.tasks.records import canonical_json, sha256_hex
from sapo.tasks.seeds import text_in_split
from tests.unit.tasks.cases import ALL_SPECS, records_of

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def record() -> QuestionRecord:
    return records_of(PAPER_PROFILE[5], 1)[0]  # calendar_arithmetic


def _with_provenance(record: QuestionRecord, **changes: Any) -> QuestionRecord:
    return dataclasses.replace(record, provenance=dataclasses.replace(record.provenance, **changes))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_every_task_round_trips_through_rederive(spec: TaskSpec) -> None:
    for split in ("train", "eval"):
        for record in records_of(spec, 4, split):
            assert rederive(record.provenance) == record
            assert verify_question(record) is None


def test_a_record_off_the_wire_still_verifies(record: QuestionRecord) -> None:
    decoded = dataclasses.replace(record, metadata=json.loads(record.metadata_json))
    assert verify_question(decoded) is None


def test_tampered_answer_is_rejected(record: QuestionRecord) -> None:
    assert verify_question(dataclasses.replace(record, answer=record.answer + "1")) == "answer_mismatch"


def test_tampered_question_and_metadata_are_rejected(record: QuestionRecord) -> None:
    assert verify_question(dataclasses.replace(record, text="What is 1 + 1?")) == "question_mismatch"
    metadata = {**record.metadata, "task": "is_leap_year"}
    assert verify_question(dataclasses.replace(record, metadata=metadata)) == "metadata_mismatch"
    assert verify_question(dataclasses.replace(record, task="bf")) == "task_mismatch"


def test_tampered_config_is_rejected(record: QuestionRecord) -> None:
    config = json.loads(record.provenance.config_json)
    config["year"] = 1999
    forged = canonical_json(config)
    assert verify_question(_with_provenance(record, config_json=forged)) == "config_digest_mismatch"
    consistent = _with_provenance(record, config_json=forged, config_digest=sha256_hex(forged))
    assert verify_question(consistent) == "question_mismatch"


def test_provenance_problems_are_rejected_before_generating(record: QuestionRecord) -> None:
    bad_json = '{"not_a_field":1}'
    cases = {
        "unknown_dataset": _with_provenance(record, dataset="no_such_task"),
        "unsafe_verifier": _with_provenance(record, dataset="countdown"),
        "generator_version_mismatch": _with_provenance(record, generator_version="reasoning-gym 0.0.1"),
        "split_mismatch": _with_provenance(record, split="eval"),
        "index_out_of_range": _with_provenance(record, index=2**40),
        "invalid_config": _with_provenance(record, config_json=bad_json, config_digest=sha256_hex(bad_json)),
    }
    for reason, forged in cases.items():
        assert reason in REJECTION_REASONS
        assert verify_question(forged) == reason, reason


def test_an_item_from_the_eval_text_half_cannot_pass_as_training(record: QuestionRecord) -> None:
    """Items the train stream skips (their text hashes to eval) are rejected even with a train seed."""
    provenance = record.provenance
    for index in itertools.count(provenance.index + 1):
        candidate = generate_record(record.task, provenance.config_json, provenance.seed, index, "train")
        if not text_in_split(candidate.text, "train"):
            break
    assert verify_question(candidate) == "split_mismatch"


def test_unknown_generator_version_is_judged_by_the_item(record: QuestionRecord) -> None:
    assert verify_question(_with_provenance(record, generator_version="")) is None
