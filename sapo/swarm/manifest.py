"""The swarm manifest: which nodes run, with which model, task profile, I/J mix, sharing and pacing.

A manifest is YAML (or JSON). `defaults` apply to every node; each node may override any key. The
short keys below are what people set; `generator`, `sampler` and `trainer` hold raw settings of one
service (field names of that service's settings class) for everything else.

    name: small
    defaults: {model: "bundled:smollm2-135m-instruct", profile: easy, local_groups: 2, external_groups: 2}
    nodes:
      - {id: node-a, seed: 1}
      - {id: node-b, seed: 2, model: "tiny:7"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sapo.settings import ConfigError
from sapo.topics import NODE_ID_PATTERN


class NodeSpec(BaseModel):
    """One node after defaults were applied."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(..., pattern=NODE_ID_PATTERN, description="Node id (lowercase letters, digits, '-').")
    seed: int = Field(0, ge=0, description="Seeds the node's question stream and sampling.")
    model: str = Field(
        "bundled:smollm2-135m-instruct",
        description=(
            "Model ref: bundled:, tiny:<seed>, warm:<seed>, tiny-bpe:<seed>, warm-bpe:<seed> (the project's "
            "BPE tokenizer), HF id or path."
        ),
    )
    profile: str = Field("easy", description="Task profile name (easy, paper) or path of a profile file.")
    questions_per_round: int = Field(8, ge=1, le=1024, description="B: questions generated per round.")
    completions_per_question: int = Field(8, ge=2, le=256, description="L: completions per question.")
    local_groups: int = Field(4, ge=0, le=1024, description="I: local groups per training batch.")
    external_groups: int = Field(4, ge=0, le=1024, description="J: external groups per training batch.")
    sharing: Literal["all", "none", "fraction", "variance"] = Field(
        "all", description="What the node shares."
    )
    round_mode: Literal["lockstep", "deadline", "async"] = Field("lockstep", description="Round pacing.")
    rounds: int = Field(5, ge=1, le=1_000_000, description="Rounds to run.")
    max_new_tokens: int = Field(48, ge=1, le=8192, description="Longest completion, in tokens.")
    learning_rate: float = Field(
        1e-5, gt=0, le=1.0, description="AdamW learning rate (paper ambiguity: 1e-3 vs 1e-6..1e-5)."
    )
    temperature: float | None = Field(
        None,
        description="Sampling temperature: the generator's `temperature` and the trainer's "
        "`sampling_temperature`, which must agree. Unset = the services' default.",
    )
    generator: dict[str, Any] = Field(default_factory=dict, description="Raw generator settings.")
    sampler: dict[str, Any] = Field(default_factory=dict, description="Raw sampler settings.")
    trainer: dict[str, Any] = Field(default_factory=dict, description="Raw trainer settings.")

    @model_validator(mode="after")
    def _check_mix(self) -> NodeSpec:
        if self.local_groups + self.external_groups < 1:
            raise ValueError(f"node {self.id}: local_groups + external_groups must be >= 1")
        if self.local_groups > self.questions_per_round:
            raise ValueError(
                f"node {self.id}: local_groups ({self.local_groups}) cannot exceed questions_per_round "
                f"({self.questions_per_round}): a round has only that many local groups"
            )
        return self


class SwarmManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("swarm", pattern=r"^[a-z0-9][a-z0-9-]{0,47}$", description="Run name.")
    bootstrap: str | None = Field(
        None, description="Existing Kafka bootstrap servers; unset = embedded broker."
    )
    topic_prefix: str = Field("sapo", description="Prefix of every topic name.")
    nodes: tuple[NodeSpec, ...] = Field(..., min_length=1, description="The nodes.")

    @model_validator(mode="after")
    def _unique_ids(self) -> SwarmManifest:
        ids = [n.id for n in self.nodes]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"node ids must be unique; repeated: {', '.join(dupes)}")
        return self


def _merge(defaults: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in node.items():
        if key in ("generator", "sampler", "trainer") and isinstance(value, dict):
            merged[key] = {**defaults.get(key, {}), **value}
        else:
            merged[key] = value
    return merged


def parse_manifest(data: dict[str, Any]) -> SwarmManifest:
    """Apply defaults to every node and validate; errors name the node and the key to fix."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise ConfigError("swarm manifest: expected a mapping with a `nodes` list")
    defaults = data.get("defaults") or {}
    body = {k: v for k, v in data.items() if k != "defaults"}
    body["nodes"] = [_merge(defaults, n) for n in data["nodes"]]
    try:
        return SwarmManifest(**body)
    except ValidationError as exc:
        lines = ["invalid swarm manifest:"]
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def load_manifest(path: Path) -> SwarmManifest:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read swarm manifest {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"swarm manifest {path} is not valid YAML: {exc}") from None
    return parse_manifest(data)
