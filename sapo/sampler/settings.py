"""The sampler's settings: env prefix `SAPO_SAMPLER_`, nested with `__`.

Grouped as: batch composition (I/J and how they move), round modes, trust bounds (which groups are
usable at all, and when they are verified), selection, memory bounds, recovery, warm start (the
nested `WarmStartSettings`, `SAPO_SAMPLER_WARM_START__*`). Every cross-field
rule fails at start with what to set, e.g. `SAPO_SAMPLER_LOCAL_GROUPS=0` and
`SAPO_SAMPLER_EXTERNAL_GROUPS=0` together are refused.
"""

from __future__ import annotations

import re
from typing import Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sapo.grpo.advantages import AdvantageScale
from sapo.sampler import (
    AssemblyConfig,
    History,
    Mix,
    MixPolicy,
    RoundMode,
    SamplerCore,
    ScreenConfig,
    SelectionPolicy,
    VerifyMode,
    WarmConfig,
)
from sapo.settings import LeaseSettings, PeerMetricsSettings, RoundSettings, ServiceSettings
from sapo.tasks import config_digests, load_profile
from sapo.tasks.datasets import UNSAFE_VERIFIERS, is_known_dataset

H = TypeVar("H")


class WarmStartSettings(BaseModel):
    """Late join (`sapo.sampler.warm`): a node with no trained history of its own first trains on the
    swarm topic's retained history, screened exactly as live groups, then joins live rounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False,
        description="Warm-start a node that has trained nothing yet (no batch of its own, its trainer "
        "at version 0) from the swarm topic's retained history before its first live round.",
    )
    max_age_s: float = Field(
        3600.0,
        gt=0,
        le=365 * 86_400,
        description="History groups completed longer ago than this (when warm start began) are not "
        "used (too_old); it replaces MAX_EXTERNAL_AGE_S for the history only.",
    )
    max_groups: int = Field(
        512,
        ge=1,
        le=1_000_000,
        description="The newest this many usable history groups are kept (memory bound, and how far "
        "back warm start reaches); older ones are counted as evicted.",
    )
    max_batches: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Most warm-start batches (policy versions) a node emits. Lock-step: one per swarm "
        "round before the one the node joins, empty for a round with no usable group, so the node's "
        "rounds line up with the swarm's; a swarm further ahead than this is replayed only for its "
        "newest rounds, and the node's rounds then do not line up.",
    )

    def config(self) -> WarmConfig:
        return WarmConfig(self.max_age_s, self.max_groups, self.max_batches)


class SamplerSettings(ServiceSettings, RoundSettings, LeaseSettings, PeerMetricsSettings):
    """Settings of one node's sampler (a singleton per node: it owns the batch sequence)."""

    model_config = SettingsConfigDict(
        env_prefix="SAPO_SAMPLER_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    # --- batch composition: I local + J external groups per optimizer step ---
    local_groups: int = Field(4, ge=0, le=256, description="I: local groups per batch (paper's best: 4).")
    external_groups: int = Field(
        4, ge=0, le=256, description="J: external (swarm) groups per batch (paper's best: 4)."
    )
    mix_policy: MixPolicy = Field(
        MixPolicy.FIXED,
        description="fixed: always I/J. adaptive: I+J fixed, J moves within the bounds below by how many "
        "local groups have signal and how full the external pool is (sapo.sampler.selection).",
    )
    adaptive_min_external: int = Field(2, ge=0, le=256, description="Adaptive: the fewest external slots.")
    adaptive_max_external: int = Field(6, ge=0, le=512, description="Adaptive: the most external slots.")
    max_per_source: int = Field(
        2, ge=1, le=256, description="At most this many external groups of one peer in one batch."
    )
    selection: SelectionPolicy = Field(
        SelectionPolicy.UNIFORM,
        description="How J is chosen from the external pool: uniform (paper) or reward_guided "
        "(weight 0.1 + the group's mean recomputed reward).",
    )
    seed: int = Field(
        0,
        ge=0,
        le=2**63 - 1,
        description="Seed of the per-batch choice (a restart re-makes the same choice).",
    )

    # --- round modes ---
    round_mode: RoundMode = Field(
        RoundMode.LOCKSTEP,
        description="lockstep: batch r = own and swarm round-r groups (the paper; needs a swarm that "
        "starts together, or a late node's WARM_START to line its rounds up). deadline: emit with what "
        "arrived by deadline_s. async: emit once I and J are in (waiting at most async_timeout_s for "
        "J). Both streaming modes wait for no more external groups than expected_peers peers can give "
        "under max_per_source.",
    )
    expected_peers: int = Field(
        7,
        ge=0,
        le=100_000,
        description="Peers of the swarm. Lock-step: their round-r groups close round r early; deadline "
        "and async: a batch waits for no more external groups than they can give under max_per_source "
        "(0: batches never wait for the swarm).",
    )
    lockstep_timeout_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="Lock-step: longest wait for peers once the local round is in.",
    )
    lockstep_local_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Lock-step: longest wait for the rest of the local round after its first group "
        "(a lost local group must not stall the node).",
    )
    deadline_s: float = Field(
        30.0,
        gt=0,
        le=86_400,
        description="Deadline: longest wait for J external groups once I local are in (or for as many as "
        "expected_peers peers can give under max_per_source, when that is fewer).",
    )
    async_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Async: longest wait for J external groups once I local are in (or for as many as "
        "expected_peers peers can give under max_per_source); then the batch goes with what arrived, the "
        "rest local, with a warning, so peers that stopped publishing (finished, gone) never stall the node. "
        "Long enough for slow peers' rounds.",
    )

    # --- trust bounds ---
    accepted_tasks: frozenset[str] | None = Field(
        None,
        description='Tasks this node trains on, as a JSON list (e.g. ["calendar_arithmetic"]); '
        "unset = every task it can re-derive and verify safely.",
    )
    accepted_profiles: tuple[str, ...] = Field(
        ("easy", "paper"),
        description="Task profiles whose dataset configurations this node re-derives, as a JSON list "
        '(built-in names, `profile:task,...` subsets or profile file paths, e.g. ["easy"]). A peer\'s '
        "group of any other configuration is refused (config_not_accepted) before anything is generated, "
        "so nobody makes the sampler pay for enormous or unknown datasets.",
    )
    accepted_config_digests: frozenset[str] = Field(
        frozenset(),
        description="More dataset configurations to accept, by their provenance config_digest (64 hex "
        "digits, as `sapo inspect` shows them), on top of ACCEPTED_PROFILES.",
    )
    max_external_age_s: float = Field(
        900.0, gt=0, le=30 * 86_400, description="External groups completed longer ago are refused."
    )
    max_clock_skew_s: float = Field(
        300.0,
        ge=0,
        le=86_400,
        description="External groups whose completed_at lies further ahead of this node's clock are "
        "refused (clock_ahead): a peer's clock that runs a few minutes fast is tolerated, a date further "
        "ahead would keep its group fresh, and replayable, for that much longer than MAX_EXTERNAL_AGE_S.",
    )
    max_policy_lag: int = Field(
        4, ge=0, le=1_000_000, description="Local groups more policy versions behind the batch are refused."
    )
    advantage_scale: AdvantageScale = Field(
        "std", description="std: (r - mean) / (std + eps) as GRPO; none: r - mean (Dr. GRPO)."
    )
    advantage_eps: float = Field(1e-4, ge=0, le=1.0, description="eps of the advantage denominator.")
    keep_local_zero_advantage: bool = Field(
        False,
        description="Keep the node's own groups whose rewards are all equal (advantage 0) in its batches, "
        "as the public reference did; only the swarm's are filtered then. A baseline to measure against: "
        "they train nothing, dilute the token-mean loss and raise or lower the batch mean reward.",
    )
    verify: VerifyMode = Field(
        VerifyMode.EAGER,
        description="When external groups are re-derived and re-scored. eager: every arriving group. "
        "lazy: only the groups the selection picks (arrivals pass the cheap filters, and the sender's "
        "claimed rewards must have signal); a picked group that fails is rejected and replaced. Same "
        "draw as eager for uniform selection and honest senders (sapo.sampler.screen).",
    )

    # --- memory bounds ---
    max_pool_groups: int = Field(
        4096, ge=1, le=1_000_000, description="Pooled groups per origin; beyond it the oldest are evicted."
    )
    dedupe_capacity: int = Field(
        200_000,
        ge=1000,
        le=50_000_000,
        description="Group ids remembered for dedupe; must cover every group that can arrive within the "
        "age and staleness bounds.",
    )

    # --- recovery from the batch topic on start ---
    recovery_idle_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="Recovery reads the batch topic (and warm start the swarm topic) until nothing arrived "
        "for this long (longer than a fetch wait; never relies on the high watermark).",
    )
    recovery_timeout_s: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="Give up (exit) when recovery (or warm start's read of the swarm history) has not "
        "finished by then.",
    )

    # --- late join ---
    warm_start: WarmStartSettings = Field(
        default_factory=WarmStartSettings,
        description="Warm start from the swarm's history (WARM_START__ENABLED, WARM_START__MAX_AGE_S, "
        "WARM_START__MAX_GROUPS, WARM_START__MAX_BATCHES).",
    )

    @model_validator(mode="after")
    def _check_composition(self) -> Self:
        total = self.local_groups + self.external_groups
        if total < 1:
            raise ValueError(
                "a batch needs at least one group: set SAPO_SAMPLER_LOCAL_GROUPS or "
                "SAPO_SAMPLER_EXTERNAL_GROUPS to 1 or more"
            )
        if self.round_mode is RoundMode.LOCKSTEP and self.local_groups > self.questions_per_round:
            raise ValueError(
                f"lock-step takes I={self.local_groups} local groups from a round of "
                f"{self.questions_per_round}: set SAPO_SAMPLER_LOCAL_GROUPS <= "
                "SAPO_SAMPLER_QUESTIONS_PER_ROUND"
            )
        if self.mix_policy is MixPolicy.ADAPTIVE and not (
            self.adaptive_min_external <= self.external_groups <= self.adaptive_max_external <= total
        ):
            raise ValueError(
                "adaptive I/J needs ADAPTIVE_MIN_EXTERNAL <= EXTERNAL_GROUPS <= ADAPTIVE_MAX_EXTERNAL <= "
                f"LOCAL_GROUPS + EXTERNAL_GROUPS; got {self.adaptive_min_external} <= {self.external_groups}"
                f" <= {self.adaptive_max_external} <= {total}: set SAPO_SAMPLER_ADAPTIVE_MIN_EXTERNAL and "
                "SAPO_SAMPLER_ADAPTIVE_MAX_EXTERNAL accordingly"
            )
        return self

    @model_validator(mode="after")
    def _check_verify(self) -> Self:
        if self.verify is VerifyMode.LAZY and self.selection is SelectionPolicy.REWARD_GUIDED:
            raise ValueError(
                "lazy verification would weight reward-guided selection by the senders' claimed rewards, "
                "which a sender can inflate to be picked more often: set SAPO_SAMPLER_VERIFY=eager, or "
                "SAPO_SAMPLER_SELECTION=uniform"
            )
        return self

    @model_validator(mode="after")
    def _check_tasks(self) -> Self:
        if self.accepted_tasks is not None:
            if not self.accepted_tasks:
                raise ValueError("SAPO_SAMPLER_ACCEPTED_TASKS is empty: list a task, or unset it for all")
            bad = sorted(t for t in self.accepted_tasks if not is_known_dataset(t) or t in UNSAFE_VERIFIERS)
            if bad:
                raise ValueError(
                    f"SAPO_SAMPLER_ACCEPTED_TASKS has {bad}: not a reasoning-gym task, or one whose "
                    "verifier would run peer text as code; remove them"
                )
        return self

    @field_validator("accepted_profiles")
    @classmethod
    def _check_profiles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError('SAPO_SAMPLER_ACCEPTED_PROFILES is empty: list a profile, e.g. ["easy"]')
        for name in value:
            load_profile(name)  # a ProfileError says which names and files exist
        return value

    @field_validator("accepted_config_digests")
    @classmethod
    def _check_digests(cls, value: frozenset[str]) -> frozenset[str]:
        bad = sorted(d for d in value if not re.fullmatch(r"[0-9a-f]{64}", d))
        if bad:
            raise ValueError(
                f"SAPO_SAMPLER_ACCEPTED_CONFIG_DIGESTS has {bad[:3]}: each must be a config_digest, "
                "64 lower-case hex digits"
            )
        return value

    def accepted_configs(self) -> frozenset[str]:
        """Every config digest this node re-derives: its accepted profiles' and the allow-list."""
        digests = set(self.accepted_config_digests)
        for name in self.accepted_profiles:
            digests |= config_digests(load_profile(name))
        return frozenset(digests)

    def screen_config(self) -> ScreenConfig:
        return ScreenConfig(
            node_id=self.node_id,
            accepted_tasks=self.accepted_tasks,
            accepted_configs=self.accepted_configs(),
            max_payload_bytes=self.max_payload_bytes,
            max_external_age_s=self.max_external_age_s,
            max_clock_skew_s=self.max_clock_skew_s,
            max_policy_lag=self.max_policy_lag,
            advantage_scale=self.advantage_scale,
            advantage_eps=self.advantage_eps,
            verify=self.verify,
            dedupe_capacity=self.dedupe_capacity,
            keep_local_zero_advantage=self.keep_local_zero_advantage,
        )

    def external_shortfall(self) -> str | None:
        """Why batches will hold fewer than J external groups, or None: with expected_peers peers and
        at most max_per_source groups of each, J may be out of reach (a warning, not an error: a peer
        count can change while the node runs)."""
        reachable = self.max_per_source * self.expected_peers
        if self.external_groups <= reachable:
            return None
        if self.expected_peers == 0:
            return (
                f"J = {self.external_groups} external groups per batch, but EXPECTED_PEERS is 0: batches "
                "never wait for the swarm and may hold no external group; set SAPO_SAMPLER_EXPECTED_PEERS "
                "to the number of other nodes that publish"
            )
        needed = -(-self.external_groups // self.expected_peers)
        fewer = (
            "smaller batches"
            if self.round_mode is RoundMode.LOCKSTEP
            else f"batches of at most {reachable} external groups, the rest local"
        )
        return (
            f"J = {self.external_groups} external groups per batch is out of reach: {self.expected_peers} "
            f"peers x MAX_PER_SOURCE {self.max_per_source} = {reachable}; set SAPO_SAMPLER_MAX_PER_SOURCE "
            f">= {needed} or expect {fewer}"
        )

    def assembly_config(self) -> AssemblyConfig:
        return AssemblyConfig(
            mode=self.round_mode,
            mix=Mix(
                self.local_groups,
                self.external_groups,
                self.mix_policy,
                self.adaptive_min_external,
                self.adaptive_max_external,
            ),
            selection=self.selection,
            max_per_source=self.max_per_source,
            max_pool_groups=self.max_pool_groups,
            max_external_age_s=self.max_external_age_s,
            max_policy_lag=self.max_policy_lag,
            questions_per_round=self.questions_per_round,
            expected_peers=self.expected_peers,
            lockstep_timeout_s=self.lockstep_timeout_s,
            lockstep_local_timeout_s=self.lockstep_local_timeout_s,
            deadline_s=self.deadline_s,
            async_timeout_s=self.async_timeout_s,
            seed=self.seed,
        )

    def core(self, history: History) -> SamplerCore[H]:
        """The sampler's pure core, continuing the batch sequence and dedupe set recovered in `history`:
        built here, not in `sapo.node.build`, so that a sampler process never loads torch."""
        return SamplerCore(self.screen_config(), self.assembly_config(), history)
