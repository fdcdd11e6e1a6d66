"""Fixtures for backend tests: the bundled tokenizer once per session, a fresh tiny model per test."""

from __future__ import annotations

import os

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.backends import TransformersBackend
from sapo.models import build_tiny_model, load_bundled_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, whatever a test does


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    """The bundled SmolLM2 tokenizer (extracted from the GGUF on the very first run, then cached)."""
    return load_bundled_tokenizer()


@pytest.fixture
def backend(tokenizer: PreTrainedTokenizerBase) -> TransformersBackend:
    """A backend over a fresh fp32 ``tiny:0`` model (tests may reload its weights)."""
    return TransformersBackend(build_tiny_model(tokenizer, seed=0), tokenizer)


@pytest.fixture
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Three chat prompts of different lengths, so the batch needs left padding."""
    questions = ["What is 2 + 3?", "Hi", "List three prime numbers greater than ten, separated by commas."]
    encoded = []
    for question in questions:
        messages = [{"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)
        encoded.append(tokenizer.encode(text, add_special_tokens=False))
    return encoded
