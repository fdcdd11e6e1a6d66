"""One place that builds a node's model-bearing parts from their settings: the generator's model
backend and round source, and the trainer (the sampler's pure core comes from `SamplerSettings.core`,
which loads no torch). The services (`sapo.node.generator`, `.sampler`, `.trainer`) and the in-process
swarm (`sapo.swarm.inprocess`) both build through these, so the two modes run the same configuration.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from sapo.backends import GenerationBackend, SamplingConfig, TransformersBackend, VLLMBackend
from sapo.checkpoints import CheckpointStore
from sapo.generator import RoundSource
from sapo.generator.settings import BackendKind, GeneratorSettings
from sapo.models import load_model, tokenizer_fingerprint
from sapo.tasks import STOP_STRINGS
from sapo.trainer import Trainer
from sapo.trainer.settings import TrainerSettings


def build_backend(settings: GeneratorSettings) -> GenerationBackend:
    """The sampling backend of the settings (loads the model: seconds to minutes)."""
    if settings.backend is BackendKind.VLLM:
        return VLLMBackend.from_model_ref(settings.model, dtype=settings.dtype.value)
    dtype: torch.dtype = getattr(torch, settings.dtype.value)
    return TransformersBackend.from_model_ref(
        settings.model, dtype=dtype, device=settings.device, quantization=settings.quantization.value
    )


def model_shapes(backend: GenerationBackend) -> dict[str, tuple[int, ...]] | None:
    """Parameter shapes of an in-process model (the follower checks checkpoints against them)."""
    if isinstance(backend, TransformersBackend):
        return {name: tuple(t.shape) for name, t in backend.model.state_dict().items()}
    return None  # vLLM's workers hold the model in other processes; the engine checks names itself


def round_source(settings: GeneratorSettings, tokenizer: PreTrainedTokenizerBase) -> RoundSource:
    """What every group of this generator shares (node, model, seed, sampling knobs)."""
    return RoundSource(
        node_id=settings.node_id,
        model_id=settings.model,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        node_seed=settings.effective_node_seed,
        sampling=SamplingConfig(
            max_new_tokens=settings.max_new_tokens,
            num_samples=settings.completions_per_question,
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop=STOP_STRINGS,
            quantization=settings.quantization.value,
        ),
    )


def build_trainer(settings: TrainerSettings) -> Trainer:
    """Load the model named by the settings and wrap it in a `Trainer` (not yet resumed)."""
    torch.manual_seed(settings.seed)
    model, tokenizer = load_model(settings.model, dtype=torch.float32, device=settings.device)
    return Trainer(
        model,
        tokenizer,
        model_ref=settings.model,
        node_id=settings.node_id,
        store=CheckpointStore(
            settings.checkpoint_root, keep_last=settings.keep_last, digest=settings.checkpoint_digest
        ),
        optim=settings.optim_config(),
        step=settings.step_config(),
        max_sequence_tokens=settings.max_sequence_tokens,
        external_logprobs=settings.external_logprobs,
        sampling_temperature=settings.sampling_temperature,
        gradient_checkpointing=settings.gradient_checkpointing,
    )
