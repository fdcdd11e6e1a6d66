"""Policy models: loading by reference (bundled, tiny random, warm-started tiny, HF id/path), fingerprints."""

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
from sapo.models.warm import WarmRecipe, parse_warm_ref, train_warm_model, warm_model_dir

__all__ = [
    "BUNDLED_REF",
    "TinySpec",
    "WarmRecipe",
    "build_tiny_model",
    "bundled_model_dir",
    "bundled_tokenizer_dir",
    "cache_root",
    "load_bundled_tokenizer",
    "load_model",
    "parse_tiny_ref",
    "parse_warm_ref",
    "tokenizer_fingerprint",
    "train_warm_model",
    "warm_model_dir",
]
