"""Task streams: reproducible, different per node, eval never overlapping training."""

from __future__ import annotations

from collections import Counter

import pytest

from sapo.tasks import (
    EASY_PROFILE,
    GENERATOR_VERSION,
    PAPER_PROFILE,
    TaskSpec,
    TaskStream,
    UnscorableTaskError,
)
from sapo.tasks.records import sha256_hex
from sapo.tasks.reward import reference_reward
from sapo.tasks.seeds import derive_seed, seed_in_split, text_in_split
from tests.unit.tasks.cases import records_of

pytestmark = pytest.mark.unit

PAPER = {spec.name: spec for spec in PAPER_PROFILE}


def test_same_seed_gives_the_same_stream() -> None:
    assert TaskStream(PAPER_PROFILE, 11, "train").take(30) == TaskStream(PAPER_PROFILE, 11, "train").take(30)


def test_different_node_seeds_give_different_questions() -> None:
    first = {r.text for r in TaskStream(PAPER_PROFILE, 1, "train").take(50)}
    second = {r.text for r in TaskStream(PAPER_PROFILE, 2, "train").take(50)}
    assert len(first & second) <= 2  # only tiny question spaces (e.g. leap years) can coincide


def test_dataset_seed_derivation_is_pinned() -> None:
    """Changing the derivation would silently change every node's stream between versions."""
    assert derive_seed("train", "calendar_arithmetic", 0) == 3470366641636960137
    assert derive_seed("eval", "calendar_arithmetic", 0) == 7614653937517236367


def test_record_at_is_random_access_and_start_resumes() -> None:
    stream = TaskStream(EASY_PROFILE, 5, "train")
    records = stream.take(12)
    assert stream.position == 12
    assert stream.record_at(7) == records[7]
    assert TaskStream(EASY_PROFILE, 5, "train", start=7).take(5) == records[7:]


def test_task_choice_follows_weights() -> None:
    heavy = TaskSpec("basic_arithmetic", 9.0, PAPER["basic_arithmetic"].config)
    light = TaskSpec("base_conversion", 1.0, PAPER["base_conversion"].config)
    counts = Counter(r.task for r in TaskStream((heavy, light), 3, "train").take(300))
    assert 240 <= counts["basic_arithmetic"] <= 295


def test_provenance_is_complete_and_canonical() -> None:
    record = TaskStream(PAPER_PROFILE, 0, "train").take(1)[0]
    provenance = record.provenance
    assert provenance.dataset == record.task
    assert provenance.config_digest == sha256_hex(provenance.config_json)
    assert " " not in provenance.config_json
    assert provenance.generator_version == GENERATOR_VERSION == "reasoning-gym 0.1.25"
    assert provenance.split == "train"
    assert 0 <= provenance.seed < 2**64


@pytest.mark.parametrize("task", ["basic_arithmetic", "propositional_logic"])
def test_eval_questions_never_appear_in_training(task: str) -> None:
    spec = PAPER[task]
    train = records_of(spec, 300, "train", node_seed=4) + records_of(spec, 150, "train", node_seed=5)
    evaluation = records_of(spec, 300, "eval", node_seed=4)
    assert all(seed_in_split(r.provenance.seed, "train") and text_in_split(r.text, "train") for r in train)
    assert all(seed_in_split(r.provenance.seed, "eval") and text_in_split(r.text, "eval") for r in evaluation)
    assert not {r.text for r in train} & {r.text for r in evaluation}


def test_items_the_verifier_cannot_reward_are_skipped() -> None:
    """base_conversion of 0 has the empty answer "", which no answer can match."""
    spec = TaskSpec("base_conversion", 1.0, {"min_value": 0, "max_value": 1})
    records = records_of(spec, 40)
    assert all(r.answer and reference_reward(r) == 1.0 for r in records)
    assert len({r.provenance.index for r in records}) == 40


def test_a_task_that_is_never_scorable_fails_loudly() -> None:
    """graph_color has no oracle answer and no example answer: nothing to reward."""
    spec = TaskSpec("graph_color", 1.0, {})
    with pytest.raises(UnscorableTaskError, match="remove it from the profile"):
        records_of(spec, 1)
