"""Fixtures for model tests: the BPE tokenizer, built once and cached."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.models import load_bpe_tokenizer


@pytest.fixture(scope="session")
def bpe_tokenizer() -> PreTrainedTokenizerBase:
    """The project's BPE tokenizer (trained on the very first run, a few seconds, then cached)."""
    return load_bpe_tokenizer()
