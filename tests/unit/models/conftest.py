"""Fixtures for model tests: the bundled tokenizer, extracted once and cached."""

from __future__ import annotations

import os

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.models import load_bundled_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, whatever a test does


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """The bundled SmolLM2 tokenizer (extracted from the GGUF on the very first run, then cached)."""
    return load_bundled_tokenizer()
