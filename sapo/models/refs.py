"""Model references: which kinds this project builds itself, and their tokenizers."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from sapo.models.bpe import load_bpe_tokenizer
from sapo.models.bundled import load_bundled_tokenizer

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
        return load_bpe_tokenizer()
    return load_bundled_tokenizer()
