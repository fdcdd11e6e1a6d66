"""The tokenizer of a model this project builds itself (`sapo.models.refs.PROJECT_REF_KINDS`)."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from sapo.models.bpe import load_bpe_tokenizer
from sapo.models.bundled import load_bundled_tokenizer
from sapo.models.refs import PROJECT_REF_KINDS, ref_kind


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
