"""The local reward model rho^n: a dataset's own verifier applied to the tagged answer of a completion.

Rewards are recomputed by every receiver from the question it re-derived, never taken from the sender.
Only records that passed `verify_question` should be scored: some verifiers trust the record's metadata.
A completion is untrusted text (possibly a peer's), so scoring never raises on it and never hands it to a
verifier that would evaluate it as code: text without a closed answer tag scores 0.0.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import Any

from reasoning_gym.utils import extract_answer

from sapo.tasks.datasets import UNSAFE_VERIFIERS, dataset_instance, is_known_dataset
from sapo.tasks.records import QuestionRecord, canonical_json

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
"""The tags `reasoning_gym.utils.extract_answer` looks for; the prompt pre-fills the opening one."""


def score(
    record_or_entry: QuestionRecord | Mapping[str, Any], completion_text: str, prefilled: bool
) -> float:
    """Reward in [0, 1] of one completion.

    `completion_text` is what the model produced, including the `</answer>` stop string when generation
    stopped on it (HF `stop_strings` keep it; vLLM needs `include_stop_str_in_output=True`). With
    `prefilled`, the prompt ended in ANSWER_OPEN and the text is re-joined to it before extraction.
    `record_or_entry` is a QuestionRecord or a raw reasoning-gym entry (question, answer, metadata with
    `source_dataset`), which is scored with the dataset's default config.

    Text without a closed answer tag earns 0.0. A tagged wrong answer earns what the dataset's verifier
    pays, which for some tasks is a little format credit (fraction_simplification 0.01-0.1,
    propositional_logic 0.05, a weekday name in calendar_arithmetic 0.1).
    """
    dataset, entry, instance = _verifier_inputs(record_or_entry)
    if dataset in UNSAFE_VERIFIERS or instance is None:
        return 0.0
    text = (ANSWER_OPEN + completion_text) if prefilled else completion_text
    answer = extract_answer(text)
    if answer is None:  # no closed tag: nothing to verify (some verifiers would still pay 0.01)
        return 0.0
    try:
        if dataset == "binary_matrix":
            reward = _score_binary_matrix(answer, entry)
        else:
            reward = float(instance.score_answer(answer, entry))
    except Exception:  # a verifier choking on untrusted text is that text's fault: it earns nothing
        return 0.0
    return min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0


def reference_reward(record: QuestionRecord) -> float:
    """The reward of the record's own answer in tags: 1.0 for every item worth asking."""
    return score(record, f"{ANSWER_OPEN}{record.answer}{ANSWER_CLOSE}", prefilled=False)


def _verifier_inputs(record_or_entry: QuestionRecord | Mapping[str, Any]) -> tuple[str, dict[str, Any], Any]:
    """(dataset name, entry as score_answer reads it, verifier instance or None if unknown)."""
    if isinstance(record_or_entry, QuestionRecord):
        record = record_or_entry
        entry = {"question": record.text, "answer": record.answer, "metadata": record.metadata}
        dataset = record.provenance.dataset
        if not is_known_dataset(dataset):
            return dataset, entry, None
        provenance = record.provenance
        return dataset, entry, dataset_instance(dataset, provenance.config_json, provenance.seed)
    entry = dict(record_or_entry)
    metadata = entry.get("metadata")
    dataset = str(metadata.get("source_dataset", "")) if isinstance(metadata, Mapping) else ""
    if not is_known_dataset(dataset):
        return dataset, entry, None
    return dataset, entry, dataset_instance(dataset, canonical_json({}), 0)


def _score_binary_matrix(answer: str, entry: Mapping[str, Any]) -> float:
    """binary_matrix's verifier with `ast.literal_eval` in place of its `eval` of the answer.

    Same rewards for every literal answer: 1.0 for the exact grid text, 0.1 for the right grid written
    as a Python list of lists, else 0.0. Expressions such as `[[0]*3]*3` are no longer evaluated.
    """
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    try:
        rows = ast.literal_eval(answer)
        as_text = "\n".join(" ".join(str(x) for x in row) for row in rows)
    except Exception:  # anything that is not a literal grid earns nothing
        return 0.0
    return 0.1 if as_text == oracle else 0.0
