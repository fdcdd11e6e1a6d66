"""Fixtures for backend tests: a fresh tiny model per test and chat prompts of different lengths."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase

from sapo.backends import TransformersBackend
from sapo.models import build_tiny_model


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
