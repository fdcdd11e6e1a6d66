"""Fixtures unit test packages share: the bundled tokenizer (built once per session), a fresh tiny
model per test, real questions."""

from __future__ import annotations

import os

import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.models import load_bundled_tokenizer
from sapo.v1 import question_pb2
from tests.unit.trainer import builders

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, whatever a test does


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """The bundled SmolLM2 tokenizer (extracted from the GGUF on the very first run, then cached)."""
    return load_bundled_tokenizer()


@pytest.fixture
def model(tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """`tiny:0`, fresh for every test (training mutates it)."""
    return builders.tiny(tokenizer)


@pytest.fixture(scope="session")
def questions() -> list[question_pb2.Question]:
    return builders.questions(3)
