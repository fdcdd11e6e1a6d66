"""Held-out evaluation on a tiny model: same questions and seed give the same numbers, and the final
policy is read from the node's checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo.checkpoints import CheckpointStore
from sapo.experiment.evaluate import evaluate, load_final_policy
from sapo.models import load_model
from sapo.tasks import get_profile

MODEL = "tiny:3"


def test_evaluation_is_reproducible_and_bounded() -> None:
    model, tokenizer = load_model(MODEL)
    first = evaluate(model, tokenizer, "easy", questions=6, samples=2, max_new_tokens=4)
    again = evaluate(model, tokenizer, "easy", questions=6, samples=2, max_new_tokens=4)
    assert first == again
    assert (first.questions, first.samples) == (6, 2)
    # accuracy counts full-reward completions only, so it never exceeds the mean reward
    assert 0.0 <= first.accuracy <= first.reward_mean <= 1.0
    assert set(first.per_task) <= {spec.name for spec in get_profile("easy")}


def test_final_policy_is_the_latest_checkpoint(tmp_path: Path) -> None:
    base, _ = load_model(MODEL)
    store = CheckpointStore(tmp_path)
    store.publish("node-a", 0, base.state_dict(), base_model=MODEL)
    changed = {name: tensor + 1.0 for name, tensor in base.state_dict().items()}
    store.publish("node-a", 3, changed, base_model=MODEL)
    model, _, version = load_final_policy(MODEL, tmp_path, "node-a")
    assert version == 3
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, changed[name]), name
    with pytest.raises(FileNotFoundError, match="node-b"):
        load_final_policy(MODEL, tmp_path, "node-b")
