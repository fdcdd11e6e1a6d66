"""The policy model settings the generator and the trainer share: declared once, so the two agree."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from sapo.models.refs import BUNDLED_REF, ref_form_error


class ModelSettings(BaseModel):
    """Which model a node trains and samples from, and on which device."""

    model: str = Field(
        BUNDLED_REF,
        min_length=1,
        description="Policy model: `bundled:smollm2-135m-instruct`, `tiny:<seed>` (tests), `warm:<seed>` "
        "(CPU scale), `tiny-bpe:`/`warm-bpe:` (the project's BPE tokenizer), an HF id or path. Policy "
        "version 0 is these weights; generator and trainer must name the same model (generators load "
        "the trainer's checkpoints into it).",
    )
    device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:\d{1,2})?)$", description="Torch device: cpu, cuda, cuda:N."
    )

    @field_validator("model")
    @classmethod
    def _check_ref(cls, value: str) -> str:
        """A project or bundled reference written wrong fails with the settings, not once loaded."""
        error = ref_form_error(value)
        if error is not None:
            raise ValueError(error)
        return value
