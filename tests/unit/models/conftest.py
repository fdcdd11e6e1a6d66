"""Fixtures for model tests: the bundled and the BPE tokenizer, each built once and cached."""

from __future__ import annotations

import os

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.models import load_bpe_tokenizer, load_bundled_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, whatever a test does


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """The bundled SmolLM2 tokenizer (extracted from the GGUF on the very first run, then cached)."""
    return load_bundled_tokenizer()


@pytest.fixture(scope="session")
def bpe_tokenizer() -> PreTrainedTokenizerBase:
    """The project's BPE tokenizer (trained on the very first run, a few seconds, then cached)."""
    return load_bpe_tokenizer()
