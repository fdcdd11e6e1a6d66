"""Sampling backends: the interface, the transformers (CPU) backend and the vLLM (GPU) adapter."""

from sapo.backends.base import (
    FinishReason,
    GenerationBackend,
    Sample,
    SamplingConfig,
    WeightsSource,
    derive_seed,
    sample_seed,
)
from sapo.backends.hf import TransformersBackend
from sapo.backends.vllm import VLLMBackend

__all__ = [
    "FinishReason",
    "GenerationBackend",
    "Sample",
    "SamplingConfig",
    "TransformersBackend",
    "VLLMBackend",
    "WeightsSource",
    "derive_seed",
    "sample_seed",
]
