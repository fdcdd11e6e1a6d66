"""Whether a Hugging Face id or a local path can be loaded without a download, checked before loading.

The services never download a model at run time: plain ids are loaded `local_files_only` (and the
chart sets `HF_HUB_OFFLINE=1`). A model that is not there then fails deep inside `transformers` with a
traceback about cached files or connection errors; `require_local` fails first, saying where the model
was looked for and what to set to put it there.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError

from sapo.settings import ConfigError

_PATH_PREFIXES = ("/", "./", "../", "~")
_HOW = (
    "Put it there before the service starts: in the Helm chart set models.download.enabled=true (an "
    "init container runs `hf download` into the cache volume) or mount a volume holding it "
    "(models.volume) and set model to its path there; elsewhere run `hf download {ref}` with this "
    "HF_HOME, or point the `model` setting (SAPO_GENERATOR_MODEL, SAPO_TRAINER_MODEL) at a local "
    "directory."
)


class ModelUnavailableError(ConfigError):
    """The configured model cannot be loaded without a download; the message says what to set."""


def require_local(model_ref: str) -> None:
    """Return when `model_ref` (an HF id or a path) is a local directory or in the Hugging Face cache;
    raise `ModelUnavailableError` otherwise."""
    path = Path(model_ref).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return
        raise ModelUnavailableError(
            f"model {model_ref!r}: the directory holds no config.json, so it is no Hugging Face model "
            "directory: name the directory that holds the model's config.json and weights"
        )
    if model_ref.startswith(_PATH_PREFIXES):
        raise ModelUnavailableError(
            f"model {model_ref!r}: no such directory. A models volume (models.volume in the chart) is "
            "mounted read-only at models.mountPath: check the volume and that `model` names a directory "
            "in it."
        )
    try:
        cached = try_to_load_from_cache(model_ref, "config.json")
    except HFValidationError as exc:
        raise ModelUnavailableError(
            f"model {model_ref!r} is neither a local directory nor a Hugging Face id ({exc})"
        ) from None
    if isinstance(cached, str):
        return
    offline = " and this process is offline (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else ""
    raise ModelUnavailableError(
        f"model {model_ref!r} is not in the Hugging Face cache {constants.HF_HUB_CACHE} (HF_HOME / "
        f"HF_HUB_CACHE){offline}: the services never download a model at run time. "
        + _HOW.format(ref=model_ref)
    )
