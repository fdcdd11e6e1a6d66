"""Tokenizer fingerprints: equal fingerprints mean token ids and logprobs are interchangeable.

A node may reuse a peer's token ids and behaviour logprobs only if both tokenizers map the same strings
to the same ids and agree on the special tokens. The fingerprint is a sha256 over exactly that: the
vocabulary (token -> id, sorted), the named special tokens and the added tokens with their flags.
It deliberately ignores the chat template and normalizer settings, which change how text is turned into
prompts but not what an id means.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from transformers import PreTrainedTokenizerBase


def _canonical(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The fingerprinted content as plain JSON-serialisable data with a fixed order."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    special = {name: str(value) for name, value in tokenizer.special_tokens_map.items()}
    added = [
        [token_id, token.content, bool(token.special)]
        for token_id, token in sorted(tokenizer.added_tokens_decoder.items())
    ]
    return {"vocab": sorted(vocab.items()), "special": sorted(special.items()), "added": added}


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hex sha256 over the vocabulary, special tokens and added tokens of ``tokenizer``."""
    payload = json.dumps(_canonical(tokenizer), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
