"""Sampling backends: the interface, the transformers (CPU) backend and the vLLM (GPU) adapter."""

from sapo.generation.base import FinishReason, GenerationBackend, Sample, SamplingConfig, WeightsSource
from sapo.generation.hf import TransformersBackend
from sapo.generation.vllm import VLLMBackend

__all__ = [
    "FinishReason",
    "GenerationBackend",
    "Sample",
    "SamplingConfig",
    "TransformersBackend",
    "VLLMBackend",
    "WeightsSource",
]
