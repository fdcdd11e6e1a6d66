"""Trainer settings: env prefix `SAPO_TRAINER_`, nested fields with `__` (`SAPO_TRAINER_CONSUMER__...`).

Grouped as TRL's GRPOConfig is: model and numerics, optimization, the GRPO loss, sequences, checkpoints,
operations. Every field is bounded; combinations that cannot work fail at start with what to set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sapo.generator.work import PacingSettings
from sapo.grpo.config import DEFAULT_LOSS_CONFIG as PAPER_LOSS
from sapo.grpo.config import LossConfig
from sapo.models.settings import ModelSettings
from sapo.settings import LeaseSettings, PeerMetricsSettings, RoundSettings, ServiceSettings
from sapo.trainer.config import OptimConfig, Precision, Schedule, StepConfig

MAX_SEQUENCE_GAP: Final = 10_000
"""The contract's bound on how far ahead of the next expected sequence a batch may be and still be
trained (docs/contract.md section 9.2): the default of `max_sequence_gap`."""


class TrainerSettings(
    ServiceSettings, ModelSettings, RoundSettings, PacingSettings, LeaseSettings, PeerMetricsSettings
):
    """Configuration of one node's trainer (one replica per node: it owns the node's checkpoints)."""

    model_config = SettingsConfigDict(
        env_prefix="SAPO_TRAINER_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    # --- model and numerics (model, device: sapo.models.settings.ModelSettings) --------------------------
    precision: Precision = Field(
        "fp32",
        description="bf16: forward/backward under bf16 autocast with fp32 master weights and optimizer "
        "state. Faster only where bf16 matmuls are native (GPUs, CPUs with AMX / AVX512-BF16); on an "
        "AVX2-only CPU a 135M step was ~25x slower than fp32.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory (did not speed up CPU runs)."
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Torch / Python RNG seed at a fresh start.")

    # --- optimization ------------------------------------------------------------------------------------
    lr: float = Field(
        1e-5,
        gt=0,
        le=1.0,
        description="Peak AdamW learning rate, logged at start and exported. The paper says 1e-3, its "
        "reference code uses 1e-6..1e-5; 1e-5 raised the bundled 135M model's reward (docs/models.md).",
    )
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0, le=1e-2, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW decoupled weight decay.")
    lr_schedule: Schedule = Field(
        "constant", description="After warmup: constant, or cosine decay to lr * min_lr_ratio at total_steps."
    )
    warmup_steps: int = Field(0, ge=0, le=1_000_000, description="Optimizer steps of linear warmup.")
    total_steps: int = Field(
        0, ge=0, le=100_000_000, description="Optimizer steps the cosine schedule spans; 0 with constant."
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final lr / peak lr of the cosine schedule.")
    max_grad_norm: float = Field(
        1.0, ge=0, le=1e6, description="Clip the global gradient L2 norm to this; 0 = measure only."
    )
    steps_per_batch: int = Field(
        1,
        ge=1,
        le=64,
        description="Optimizer steps on each batch; pi_old stays fixed at the first, so clipping also "
        "acts within a batch when > 1.",
    )
    micro_batch_tokens: int = Field(
        4096,
        ge=16,
        le=1_048_576,
        description="Padded tokens per forward pass; bounds activation memory, whatever the batch's size: "
        "at the step's peak each scored token holds about 3 x vocabulary x 4 bytes of logits (0.6 MB with "
        "the bundled 49k vocabulary: up to ~2.5 GB at 4096 when prompts are short). Rows sharing a prompt "
        "count it once (distinct prompts x longest prompt + rows x longest completion), otherwise rows x "
        "longest row. The loss is normalized by the whole batch's completion tokens, so results do not "
        "depend on it.",
    )

    # --- GRPO loss ---------------------------------------------------------------------------------------
    clip_eps_low: float = Field(
        PAPER_LOSS.eps_low, ge=0, lt=1, description="PPO clip below: ratio >= 1 - eps_low."
    )
    clip_eps_high: float = Field(
        PAPER_LOSS.eps_high, ge=0, le=10, description="PPO clip above: ratio <= 1 + eps_high."
    )
    is_cap: float = Field(
        PAPER_LOSS.is_cap,
        ge=1,
        le=100,
        description="Truncation of the importance weight pi_old / pi_behaviour.",
    )
    external_logprobs: Literal["on_policy", "sender"] = Field(
        "on_policy",
        description="on_policy: external groups are re-tokenized and treated as on-policy (the paper). "
        "sender: with an equal tokenizer fingerprint, train on the sender's ids with its log-probs as "
        "the behaviour policy (importance-corrected).",
    )

    sampling_temperature: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="The node's own sampling temperature: must equal the generator's "
        "SAPO_GENERATOR_TEMPERATURE (a swarm manifest's `temperature` sets both). External rows are "
        "scored at it, not at the sender's temperature; a mismatch with the local groups is logged.",
    )

    # --- sequences ---------------------------------------------------------------------------------------
    max_sequence_tokens: int = Field(
        4096,
        ge=16,
        le=1_048_576,
        description="Prompt + completion tokens per row; longer completions are cut (counted).",
    )

    # --- checkpoints -------------------------------------------------------------------------------------
    checkpoint_root: str = Field(
        "checkpoints",
        min_length=1,
        description="Checkpoint store: a local path or file:// URL (one machine, a volume), "
        "s3://bucket/prefix (credentials from AWS_* variables: see sapo/storage.py), or any URL fsspec "
        "speaks. Versions go to <root>/<node_id>/.",
    )
    keep_last: int = Field(
        3,
        ge=1,
        le=10_000,
        description="Policy versions kept (plus the newest full state's); older ones are deleted after "
        "each write.",
    )
    max_step_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="Attempts at one batch's step (counted across restarts) before the batch is "
        "quarantined: dead-lettered as poison_batch and the version advanced without training it.",
    )
    max_sequence_gap: int = Field(
        MAX_SEQUENCE_GAP,
        ge=1,
        le=2**62,
        description="A batch more than this many sequences ahead of the next expected one is refused "
        "(dead-lettered as sequence_gap_too_large) rather than trained: trained, one batch with a wild "
        "sequence would make every later batch of the node's sampler late. Smaller gaps (batches lost "
        "upstream) are trained and counted.",
    )
    checkpoint_every: int = Field(
        1,
        ge=1,
        le=10_000,
        description="Publish (and announce) the weights every k batches, and when idle or stopping.",
    )
    state_every: int = Field(
        10,
        ge=1,
        le=10_000,
        description="Write the full trainer state (optimizer, schedule, RNG, offsets, ledger) every k "
        "versions and on shutdown; input offsets are committed only with it, so a crash replays at most k "
        "batches. "
        "The state of the 135M model is ~1 GiB (Adam moments) against ~0.4 GiB of weights: at 10 it costs "
        "a tenth of a write per version, and a crash costs at most 10 replayed steps.",
    )
    checkpoint_digest: Literal["xxh3-128", "blake3", "sha256"] = Field(
        "xxh3-128",
        description="Digest of checkpoint files, named in each manifest: xxh3-128 (fast; detects corruption, "
        "not forgery), blake3 (cryptographic, for stores shared with writers the node does not trust) or "
        "sha256. Readers verify whatever a manifest names.",
    )

    # --- operations --------------------------------------------------------------------------------------
    step_max_silence_s: float = Field(
        900.0,
        ge=10,
        le=86_400,
        description="Liveness window (/healthz) during a step and its checkpoint; a step that takes longer "
        "is treated as wedged. Must fit in the consumer's max_poll_interval_ms.",
    )
    idle_max_silence_s: float = Field(
        60.0, ge=5, le=3600, description="Liveness window between steps: the poll loop beats every second."
    )
    announce_timeout_s: float = Field(
        30.0, gt=0, le=600, description="How long to wait for the broker to acknowledge a PolicyUpdate."
    )

    @field_validator("checkpoint_root", mode="before")
    @classmethod
    def _path_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value

    @model_validator(mode="after")
    def _check_combinations(self) -> Self:
        if self.lr_schedule == "cosine" and self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"lr_schedule=cosine decays from warmup_steps ({self.warmup_steps}) to total_steps "
                f"({self.total_steps}): set SAPO_TRAINER_TOTAL_STEPS above SAPO_TRAINER_WARMUP_STEPS"
            )
        if self.lr_schedule == "constant" and (self.total_steps or self.min_lr_ratio):
            raise ValueError(
                "total_steps and min_lr_ratio only shape a cosine schedule: set "
                "SAPO_TRAINER_LR_SCHEDULE=cosine, or leave SAPO_TRAINER_TOTAL_STEPS and "
                "SAPO_TRAINER_MIN_LR_RATIO unset"
            )
        if self.step_max_silence_s * 1000 > self.consumer.max_poll_interval_ms:
            raise ValueError(
                f"a step may take up to step_max_silence_s={self.step_max_silence_s} s but the consumer "
                f"leaves its group after {self.consumer.max_poll_interval_ms} ms without a poll: set "
                "SAPO_TRAINER_CONSUMER__MAX_POLL_INTERVAL_MS >= 1000 x SAPO_TRAINER_STEP_MAX_SILENCE_S, or "
                "lower SAPO_TRAINER_STEP_MAX_SILENCE_S"
            )
        if self.step_max_silence_s < self.idle_max_silence_s:
            raise ValueError(
                "a step cannot be allowed less silence than the idle loop: set "
                "SAPO_TRAINER_STEP_MAX_SILENCE_S >= SAPO_TRAINER_IDLE_MAX_SILENCE_S "
                f"({self.idle_max_silence_s})"
            )
        return self

    def optim_config(self) -> OptimConfig:
        return OptimConfig(
            lr=self.lr,
            betas=(self.adam_beta1, self.adam_beta2),
            eps=self.adam_eps,
            weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps,
            schedule=self.lr_schedule,
            total_steps=self.total_steps,
            min_lr_ratio=self.min_lr_ratio,
        )

    def step_config(self) -> StepConfig:
        return StepConfig(
            loss=LossConfig(eps_low=self.clip_eps_low, eps_high=self.clip_eps_high, is_cap=self.is_cap),
            micro_batch_tokens=self.micro_batch_tokens,
            steps_per_batch=self.steps_per_batch,
            max_grad_norm=self.max_grad_norm,
            precision=self.precision,
        )
