"""Fixtures for generator tests: the bundled tokenizer once per session, tiny models on demand."""

from __future__ import annotations

import os

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.models import load_bundled_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, whatever a test does


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_bundled_tokenizer()
