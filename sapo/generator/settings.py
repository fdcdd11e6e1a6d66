"""Configuration of the generator service: env prefix `SAPO_GENERATOR_`, every field bounded.

Grouped as: model and backend, task stream, sampling (one round = B questions x L completions),
sharing, round pacing, operations. Cross-field rules fail at start with what to set instead.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sapo.generator.reload import ReloadPolicy
from sapo.generator.sharing import SharingPolicy, should_share
from sapo.models import is_project_ref
from sapo.models.settings import ModelSettings
from sapo.settings import ServiceSettings
from sapo.tasks import Profile, load_profile
from sapo.tasks.seeds import stable_hash
from sapo.v1 import rollout_pb2
from sapo.wire import MAX_GROUP_COMPLETIONS


class BackendKind(StrEnum):
    HF = "hf"  # transformers, CPU or one GPU
    VLLM = "vllm"  # vLLM engine, GPU only (the `gpu` extra)


class DType(StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class Quantization(StrEnum):
    """How the sampling weights approximate the policy (`sapo.backends.hf.QUANTIZATIONS`)."""

    NONE = ""
    INT8_DYNAMIC = "int8-dynamic"


class GeneratorSettings(ServiceSettings, ModelSettings):
    """Settings of one generator process (`SAPO_GENERATOR_*`; nested Kafka settings use `__`)."""

    model_config = SettingsConfigDict(
        env_prefix="SAPO_GENERATOR_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    # --- model and backend (model, device: sapo.models.settings.ModelSettings) ---
    backend: BackendKind = Field(BackendKind.HF, description="hf (transformers) or vllm (GPU only).")
    dtype: DType = Field(
        DType.FLOAT32,
        description="Parameter dtype. bfloat16 samples ~2x faster on CPUs with native bf16 matmuls "
        "(AVX-512 BF16, AMX) and several times slower on AVX2-only ones, and its behaviour logprobs "
        "differ slightly from an fp32 trainer's (the ratio of an unchanged policy is no longer exactly 1).",
    )
    quantization: Quantization = Field(
        Quantization.NONE,
        description="Sample from an int8 copy of the policy (`int8-dynamic`: linear layers in int8; hf "
        "backend, CPU, float32): ~1.9x faster rollouts of the bundled 135M model (3.7x with short prompts), "
        "but the copy's log-probs are ~0.8 nats/token from the policy's; the trainer importance-weights such "
        "rows. Off by default.",
    )

    # --- task stream ---
    profile: str = Field(
        "easy",
        min_length=1,
        description="Built-in task profile (`easy`, `paper`) or the path of a YAML/JSON profile file "
        "(a mapping of task name to {weight, config}).",
    )
    node_seed: int | None = Field(
        None,
        ge=0,
        le=2**63 - 1,
        description="Seeds the node's question stream, per-round sampling and fraction sharing. Unset = "
        "derived from node_id, so distinct nodes draw distinct questions (the reference code did not).",
    )

    # --- sampling ---
    completions_per_question: int = Field(
        8,
        ge=2,
        le=MAX_GROUP_COMPLETIONS,
        description="L: completions per question (>= 2: a group of one has no advantage).",
    )
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature (paper: 1.0).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass (paper: 1.0).")
    max_new_tokens: int = Field(256, ge=1, le=32768, description="Completion token limit (paper: 256).")

    # --- sharing ---
    sharing: SharingPolicy = Field(
        SharingPolicy.ALL,
        description="Groups sent to the swarm topic: all, none, fraction (deterministic per group) or "
        "variance (only groups whose rewards differ). Every group always goes to the private topic.",
    )
    share_fraction: float | None = Field(
        None, ge=0.0, le=1.0, description="Fraction of groups shared; required with sharing=fraction only."
    )

    # --- work (rounds are planned by the trainer: sapo.generator.work) ---
    max_batch_items: int = Field(
        64,
        ge=1,
        le=4096,
        description="Most work items (questions) one replica samples in one backend call; the items it "
        "holds that the loaded policy may generate are batched up to this many.",
    )
    max_version_lead: int = Field(
        1000,
        ge=1,
        le=2**62,
        description="A work item needing a policy version more than this many ahead of the newest one "
        "announced is refused (dead-lettered as version_too_far_ahead) rather than held: the trainer "
        "announces a version before it plans work that needs it, and such an item would wait for good.",
    )

    # --- operations ---
    policy_catchup_idle_s: float = Field(
        2.0,
        ge=0.05,
        le=120.0,
        description="At start, the policy topic counts as read once nothing arrived for this long after "
        "partition assignment (high watermarks are not trusted: the embedded broker reports wrong ones).",
    )
    flush_timeout_s: float = Field(
        30.0, ge=0.1, le=600.0, description="Bound on the producer flush after each backend call's groups."
    )
    liveness_timeout_s: float = Field(
        900.0,
        ge=10.0,
        le=86_400.0,
        description="/healthz fails when the loop is silent this long: must exceed the longest backend call "
        "and fit in the consumer's max_poll_interval_ms.",
    )

    weights_retry_initial_s: float = Field(
        0.5,
        ge=0.01,
        le=60.0,
        description="First wait before retrying a policy version whose manifest or shard is not visible "
        "yet (NFS attribute caches, object store replicas); doubles per attempt.",
    )
    weights_retry_max_s: float = Field(
        15.0, ge=0.01, le=600.0, description="Longest wait between two retries of one policy version."
    )
    weights_retry_give_up_s: float = Field(
        300.0,
        ge=1.0,
        le=86_400.0,
        description="Stop retrying a version that stayed unreadable this long (counted as a rejection).",
    )
    weights_max_behind_s: float = Field(
        900.0,
        ge=1.0,
        le=86_400.0,
        description="/healthz fails when announced versions newer than the loaded weights stay unloaded "
        "this long while being retried or while work waits for them (readiness is false from the first "
        "moment): a generator that cannot load what it waits for gets restarted.",
    )

    @field_validator("profile")
    @classmethod
    def _check_profile(cls, value: str) -> str:
        load_profile(value)
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> Self:
        prefix = "SAPO_GENERATOR_"
        if (self.sharing is SharingPolicy.FRACTION) != (self.share_fraction is not None):
            raise ValueError(
                f"share_fraction goes with sharing=fraction only: set {prefix}SHARING=fraction and "
                f"{prefix}SHARE_FRACTION=<0..1> together, or neither"
            )
        if self.weights_retry_max_s < self.weights_retry_initial_s:
            raise ValueError(
                f"set {prefix}WEIGHTS_RETRY_MAX_S >= {prefix}WEIGHTS_RETRY_INITIAL_S "
                f"({self.weights_retry_initial_s})"
            )
        if self.liveness_timeout_s * 1000 > self.consumer.max_poll_interval_ms:
            # A longer backend call would lose the work partitions mid-call: another replica samples
            # the same items again, and its own long call loses them in turn.
            raise ValueError(
                f"a backend call may take up to liveness_timeout_s={self.liveness_timeout_s} s but the "
                f"work consumer leaves its group after {self.consumer.max_poll_interval_ms} ms without a "
                f"poll: set {prefix}CONSUMER__MAX_POLL_INTERVAL_MS >= 1000 x {prefix}LIVENESS_TIMEOUT_S, "
                f"or lower {prefix}LIVENESS_TIMEOUT_S"
            )
        if self.backend is BackendKind.VLLM:
            self._check_vllm(prefix)
        if self.quantization and (self.backend, self.dtype, self.device) != (
            BackendKind.HF,
            DType.FLOAT32,
            "cpu",
        ):
            raise ValueError(
                f"{prefix}QUANTIZATION={self.quantization.value} quantizes float32 weights on CPU with the "
                f"hf backend: set {prefix}BACKEND=hf, {prefix}DTYPE=float32 and {prefix}DEVICE=cpu, or unset"
            )
        return self

    def _check_vllm(self, prefix: str) -> None:
        if is_project_ref(self.model):
            raise ValueError(
                f"{self.model} is built by this project, not a path vLLM can open: set {prefix}BACKEND=hf, "
                f"or set {prefix}MODEL to the directory `python -c 'from sapo.models import warm_model_dir; "
                f'print(warm_model_dir("{self.model}"))\'` prints (warm: and warm-bpe: models only)'
            )
        if self.top_p < 1.0:
            raise ValueError(
                f"the vllm backend records logprobs after top-p truncation: set {prefix}TOP_P=1 or "
                f"{prefix}BACKEND=hf"
            )

    @property
    def effective_node_seed(self) -> int:
        """node_seed, or a stable hash of node_id when unset."""
        if self.node_seed is not None:
            return self.node_seed
        return stable_hash("node-seed", self.node_id) % 2**63

    def task_profile(self) -> Profile:
        """The resolved task profile (validated at start, so this does not fail later)."""
        return load_profile(self.profile)

    def reload_policy(self) -> ReloadPolicy:
        return ReloadPolicy(
            initial_s=self.weights_retry_initial_s,
            max_s=self.weights_retry_max_s,
            give_up_s=self.weights_retry_give_up_s,
            max_behind_s=self.weights_max_behind_s,
        )

    def shares(self, group: rollout_pb2.RolloutGroup) -> bool:
        """Whether the group goes to the swarm topic under the sharing policy."""
        fraction = self.share_fraction if self.share_fraction is not None else 1.0
        return should_share(group, self.sharing, fraction=fraction, seed=self.effective_node_seed)
