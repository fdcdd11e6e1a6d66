"""Rewards: ground truth earns 1.0 on every task, garbage earns 0.0, untrusted text is never executed."""

from __future__ import annotations

import os

import pytest
import reasoning_gym

from sapo.tasks import PAPER_PROFILE, TaskSpec, score
from tests.unit.tasks.cases import ALL_SPECS, records_of

pytestmark = pytest.mark.unit

GARBAGE = [
    "",
    "I don't know",
    "</answer>",
    "<answer>",
    "<answer>unclosed forever",
    "\x00\x01\x02",
    "<" * 5000,
]


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_ground_truth_in_tags_earns_one(spec: TaskSpec) -> None:
    for record in records_of(spec, 8):
        assert score(record, f"<answer>{record.answer}</answer>", prefilled=False) == 1.0
        assert score(record, f"{record.answer}</answer>", prefilled=True) == 1.0
        assert score(record, f"reasoning first <answer>{record.answer}</answer>", prefilled=False) == 1.0


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_garbage_earns_zero_and_never_raises(spec: TaskSpec) -> None:
    record = records_of(spec, 1)[0]
    for text in GARBAGE:
        for prefilled in (False, True):
            if prefilled and text.startswith("</answer>"):
                continue  # "<answer></answer>": an empty answer, left to the verifier
            assert score(record, text, prefilled) == 0.0, (text, prefilled)
    nonsense = score(record, "<answer>¬¬ ]] 1/0 {{ \\frac</answer>", prefilled=False)
    assert 0.0 <= nonsense < 1.0


def test_binary_matrix_answers_are_never_evaluated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAPO_PWNED", raising=False)
    record = records_of(PAPER_PROFILE[4], 1)[0]
    attack = "__import__('os').environ.__setitem__('SAPO_PWNED', '1')"
    assert score(record, f"<answer>{attack}</answer>", prefilled=False) == 0.0
    assert "SAPO_PWNED" not in os.environ


def test_binary_matrix_keeps_partial_credit_for_a_list_literal() -> None:
    record = records_of(PAPER_PROFILE[4], 1)[0]
    rows = [[int(x) for x in line.split()] for line in record.answer.splitlines()]
    assert score(record, f"<answer>{rows}</answer>", prefilled=False) == 0.1


def test_a_raw_reasoning_gym_entry_can_be_scored() -> None:
    entry = reasoning_gym.create_dataset("basic_arithmetic", seed=3, size=1)[0]
    assert score(entry, f"<answer>{entry['answer']}</answer>", prefilled=False) == 1.0
    assert score(entry, "<answer>not a number</answer>", prefilled=False) == 0.0


def test_entries_of_unsafe_or_unknown_datasets_earn_zero() -> None:
    entry = {"question": "q", "answer": "1", "metadata": {"source_dataset": "countdown"}}
    assert score(entry, "<answer>1</answer>", prefilled=False) == 0.0
    assert (
        score({"question": "q", "answer": "1", "metadata": {}}, "<answer>1</answer>", prefilled=False) == 0.0
    )
