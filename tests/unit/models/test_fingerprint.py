"""Tokenizer fingerprints: equal for interchangeable tokenizers, different otherwise."""

from __future__ import annotations

import copy

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from sapo.models import load_bundled_tokenizer, load_model, tokenizer_fingerprint

pytestmark = pytest.mark.unit


def test_equal_tokenizers_have_equal_fingerprints(tokenizer: PreTrainedTokenizerBase) -> None:
    fingerprint = tokenizer_fingerprint(tokenizer)
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
    assert tokenizer_fingerprint(load_bundled_tokenizer()) == fingerprint
    _, tiny_tokenizer = load_model("tiny:5")
    assert tokenizer_fingerprint(tiny_tokenizer) == fingerprint


def test_chat_template_does_not_matter(tokenizer: PreTrainedTokenizerBase) -> None:
    other = copy.deepcopy(tokenizer)
    other.chat_template = "{{ messages[0]['content'] }}"
    assert tokenizer_fingerprint(other) == tokenizer_fingerprint(tokenizer)


def test_added_token_changes_the_fingerprint(tokenizer: PreTrainedTokenizerBase) -> None:
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<sapo_extra>"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tokenizer)


def test_special_token_role_changes_the_fingerprint(tokenizer: PreTrainedTokenizerBase) -> None:
    other = copy.deepcopy(tokenizer)
    other.pad_token = "<|endoftext|>"  # same vocabulary, different padding id
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tokenizer)


def test_different_vocabulary_differs(tokenizer: PreTrainedTokenizerBase) -> None:
    words = Tokenizer(WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    small = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")  # type: ignore[no-untyped-call]
    assert tokenizer_fingerprint(small) != tokenizer_fingerprint(tokenizer)
