"""Fixtures for model tests: the BPE tokenizer, built once and cached; a guard against training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.models import load_bpe_tokenizer
from sapo.models import warm as warm_module


@pytest.fixture(scope="session")
def bpe_tokenizer() -> PreTrainedTokenizerBase:
    """The project's BPE tokenizer (trained on the very first run, a few seconds, then cached)."""
    return load_bpe_tokenizer()


@pytest.fixture
def forbid_warm_training(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it to make any warm-up training from then on fail the test: a load after it must read
    the cache."""

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a warm model was trained again instead of read from the cache")

    def forbid() -> None:
        monkeypatch.setattr(warm_module, "train_warm_model", no_training)

    return forbid
