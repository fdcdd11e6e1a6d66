"""Policy models: loading by reference (bundled GGUF, tiny random, HF id/path) and tokenizer fingerprints."""

from sapo.models.fingerprint import tokenizer_fingerprint
from sapo.models.loading import (
    BUNDLED_REF,
    bundled_model_dir,
    bundled_tokenizer_dir,
    cache_root,
    load_bundled_tokenizer,
    load_model,
)
from sapo.models.tiny import TinySpec, build_tiny_model, parse_tiny_ref

__all__ = [
    "BUNDLED_REF",
    "TinySpec",
    "build_tiny_model",
    "bundled_model_dir",
    "bundled_tokenizer_dir",
    "cache_root",
    "load_bundled_tokenizer",
    "load_model",
    "parse_tiny_ref",
    "tokenizer_fingerprint",
]
