"""The swarm manifest: which nodes run, and each node's settings, in a few short keys.

A manifest is YAML (or JSON). `defaults` apply to every node; each node may override any key. The
short keys (`SHORT_KEYS`) are what people set; each maps onto one or more fields of the services'
settings classes, which declare every bound and default: a short key left unset takes the service's
default. `generator`, `sampler` and `trainer` hold raw settings of one service (field names of that
service's settings class) for everything else.

    name: small
    defaults: {model: "bundled:smollm2-135m-instruct", profile: easy, local_groups: 2, external_groups: 2}
    nodes:
      - {id: node-a, seed: 1, rounds: 5}
      - {id: node-b, seed: 2, rounds: 5, model: "tiny:7"}

A manifest is checked whole when it is read: every node's three settings are built (`resolve`), so a
bad value fails before anything starts, naming the node and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sapo.cliargs import broker_addresses
from sapo.generator.settings import GeneratorSettings
from sapo.generator.work import PacingMode
from sapo.sampler.assembler import RoundMode
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConfigError, ConsumerProfile, ServiceSettings, load_settings
from sapo.topics import NODE_ID_PATTERN
from sapo.trainer.settings import TrainerSettings

Service = Literal["generator", "sampler", "trainer"]
SERVICES: Final[tuple[Service, ...]] = ("generator", "sampler", "trainer")
SETTINGS: Final[dict[Service, type[ServiceSettings]]] = {
    "generator": GeneratorSettings,
    "sampler": SamplerSettings,
    "trainer": TrainerSettings,
}

SHORT_KEYS: Final[dict[str, tuple[tuple[Service, str], ...]]] = {
    "model": (("generator", "model"), ("trainer", "model")),
    "seed": (("generator", "node_seed"), ("sampler", "seed"), ("trainer", "seed")),
    "profile": (("generator", "profile"),),
    "questions_per_round": (("sampler", "questions_per_round"), ("trainer", "questions_per_round")),
    "completions_per_question": (("generator", "completions_per_question"),),
    "local_groups": (("sampler", "local_groups"),),
    "external_groups": (("sampler", "external_groups"),),
    "sharing": (("generator", "sharing"),),
    "round_mode": (("sampler", "round_mode"), ("trainer", "round_mode")),
    "rounds": (("trainer", "rounds"),),
    "max_new_tokens": (("generator", "max_new_tokens"),),
    "learning_rate": (("trainer", "lr"),),
    "store": (("trainer", "checkpoint_root"),),
    "temperature": (("generator", "temperature"), ("trainer", "sampling_temperature")),
}
"""Each short key and the settings fields it sets (a key shared by two services keeps them in step)."""


def _doc(key: str) -> str:
    service, field = SHORT_KEYS[key][0]
    description = SETTINGS[service].model_fields[field].description or ""
    return f"{description} (sets {', '.join(f'{s}.{f}' for s, f in SHORT_KEYS[key])}; unset = their default)"


class NodeSpec(BaseModel):
    """One node after defaults were applied. Short keys hold only what the manifest says (None = the
    services' defaults); their bounds are the settings classes', checked by `resolve`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(..., pattern=NODE_ID_PATTERN, description="Node id (lowercase letters, digits, '-').")
    rounds: int = Field(
        ..., gt=0, description="Rounds the node runs: a local swarm ends when every node has trained them."
    )
    generator_replicas: int = Field(
        1,
        ge=1,
        description="Generator processes of the node, sharing its work (a launcher setting: the launcher "
        "creates the node's work topic with one partition per replica; on an existing cluster whose topic "
        "has fewer partitions, the replicas beyond them idle).",
    )
    model: str | None = Field(None, description=_doc("model"))
    seed: int | None = Field(None, description=_doc("seed"))
    profile: str | None = Field(None, description=_doc("profile"))
    questions_per_round: int | None = Field(None, description=_doc("questions_per_round"))
    completions_per_question: int | None = Field(None, description=_doc("completions_per_question"))
    local_groups: int | None = Field(None, description=_doc("local_groups"))
    external_groups: int | None = Field(None, description=_doc("external_groups"))
    sharing: str | None = Field(None, description=_doc("sharing"))
    round_mode: RoundMode | None = Field(
        None, description=_doc("round_mode") + "; the trainer plans lockstep rounds, or async for the others"
    )
    max_new_tokens: int | None = Field(None, description=_doc("max_new_tokens"))
    learning_rate: float | None = Field(None, description=_doc("learning_rate"))
    store: str | None = Field(
        None,
        description=_doc("store") + "; the launcher's default is <run dir>/checkpoints, and generators "
        "load the announced versions from wherever it is (credentials from the launcher's environment)",
    )
    temperature: float | None = Field(
        None,
        description=_doc("temperature") + "; a raw generator `temperature` reaches the trainer too, "
        "which scores peers' rows at its own node's sampling temperature",
    )
    generator: dict[str, Any] = Field(default_factory=dict, description="Raw generator settings.")
    sampler: dict[str, Any] = Field(default_factory=dict, description="Raw sampler settings.")
    trainer: dict[str, Any] = Field(default_factory=dict, description="Raw trainer settings.")

    def raw(self, service: Service) -> dict[str, Any]:
        raw: dict[str, Any] = getattr(self, service)
        return raw


class SwarmManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("swarm", pattern=r"^[a-z0-9][a-z0-9-]{0,47}$", description="Run name.")
    bootstrap: str | None = Field(
        None, description="Existing Kafka bootstrap servers; unset = embedded broker."
    )
    topic_prefix: str = Field("sapo", description="Prefix of every topic name.")
    nodes: tuple[NodeSpec, ...] = Field(..., min_length=1, description="The nodes.")

    @field_validator("bootstrap")
    @classmethod
    def _broker_list(cls, value: str | None) -> str | None:
        """The form of a broker list, as the services check theirs (`sapo swarm` looks the names up
        before it starts anything), and no scheme but PLAINTEXT: the launcher and the services it starts
        connect in PLAINTEXT, and librdkafka drops a broker of another scheme."""
        if value is not None:
            for address in broker_addresses(value):
                if address.scheme not in (None, "PLAINTEXT"):
                    raise ValueError(
                        f"the scheme {address.scheme}:// is not PLAINTEXT://: a swarm connects to its "
                        "brokers in PLAINTEXT; leave the scheme out"
                    )
        return value

    @model_validator(mode="after")
    def _unique_ids(self) -> SwarmManifest:
        ids = [n.id for n in self.nodes]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"node ids must be unique; repeated: {', '.join(dupes)}")
        return self


def service_values(
    node: NodeSpec, service: Service, peers: int, profiles: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The settings one service of a node runs with, as field values: the short keys the manifest
    sets, mapped onto the service's fields, then the node's raw settings of that service on top.
    `peers` is how many other nodes publish to the swarm (what a sampler waits for, in every round mode);
    `profiles` the task profiles the swarm's generators draw from (its sampler accepts their
    configurations, `swarm_profiles`)."""
    values: dict[str, Any] = {}
    for key, targets in SHORT_KEYS.items():
        value = getattr(node, key)
        for target_service, field in targets:
            if value is None or target_service != service:
                continue
            if key == "round_mode" and service == "trainer":  # the trainer plans rounds: its pacing
                value = PacingMode.LOCKSTEP if value == RoundMode.LOCKSTEP else PacingMode.ASYNC
            values[field] = value
    if service == "sampler":
        values["expected_peers"] = peers
        if profiles:
            values["accepted_profiles"] = list(profiles)
    if service == "trainer" and node.temperature is None and "temperature" in node.generator:
        values["sampling_temperature"] = node.generator["temperature"]  # one temperature per node
    return values | node.raw(service)


@dataclass(frozen=True)
class NodeSettings:
    """The three services' settings of one node, as the services will build them."""

    generator: GeneratorSettings
    sampler: SamplerSettings
    trainer: TrainerSettings


def swarm_profiles(manifest: SwarmManifest) -> tuple[str, ...]:
    """Every task profile a generator of the manifest draws from, in node order, once each."""
    default = GeneratorSettings.model_fields["profile"].default
    profiles = (service_values(n, "generator", 0).get("profile", default) for n in manifest.nodes)
    return tuple(dict.fromkeys(profiles))


def sharing_peers(manifest: SwarmManifest, node: NodeSpec) -> int:
    """How many other nodes of the manifest publish to the swarm topic."""
    return sum(1 for n in manifest.nodes if n.id != node.id and n.sharing != "none")


def resolve(manifest: SwarmManifest, node: NodeSpec, checkpoint_root: Path) -> NodeSettings:
    """The node's settings from the same values the launcher hands its services, plus what the launcher
    sets (node id, topic prefix, the embedded broker's consumer profile, `checkpoint_root` unless the
    node names a store). Through `load_settings`,
    exactly as the services build theirs: stray `SAPO_<SERVICE>_*` variables of this process act as
    they would on the services (the launcher hands its environment on)."""
    common: dict[str, Any] = {"node_id": node.id, "topic_prefix": manifest.topic_prefix}
    if manifest.bootstrap is None:  # the launcher's embedded-broker profile (trainer settings check it)
        common["consumer"] = ConsumerProfile.local_swarm().model_dump()
    peers, profiles = sharing_peers(manifest, node), swarm_profiles(manifest)

    def values(service: Service) -> dict[str, Any]:
        extra = {"checkpoint_root": str(checkpoint_root)} if service == "trainer" else {}
        return common | extra | service_values(node, service, peers, profiles)

    return NodeSettings(
        generator=load_settings(GeneratorSettings, **values("generator")),
        sampler=load_settings(SamplerSettings, **values("sampler")),
        trainer=load_settings(TrainerSettings, **values("trainer")),
    )


def _merge(defaults: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in node.items():
        if key in SERVICES and isinstance(value, dict):
            merged[key] = {**defaults.get(key, {}), **value}
        else:
            merged[key] = value
    return merged


def _check_settings(manifest: SwarmManifest) -> None:
    """Build every node's settings once, so a bad value fails here, named by node and manifest key."""
    for node in manifest.nodes:
        try:
            resolve(manifest, node, Path("checkpoints"))
        except ConfigError as exc:
            keys = {f"{s.upper()}_{f.upper()}": k for k, targets in SHORT_KEYS.items() for s, f in targets}
            message = str(exc)
            for env, key in keys.items():
                message = message.replace(f"SAPO_{env}:", f"SAPO_{env} (manifest key {key}):")
            raise ConfigError(f"swarm manifest, node {node.id}: {message}") from None


def parse_manifest(data: dict[str, Any]) -> SwarmManifest:
    """Apply defaults to every node and validate; errors name the node and the key to fix."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise ConfigError("swarm manifest: expected a mapping with a `nodes` list")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"swarm manifest: `defaults` is a mapping of settings, got {defaults!r}")
    nodes = data["nodes"]
    if not isinstance(nodes, list):
        raise ConfigError(
            "swarm manifest: `nodes` is a list of nodes (`- id: node-a`, ...), got a " + type(nodes).__name__
        )
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise ConfigError(
                f"swarm manifest: nodes[{index}] is a mapping with an `id` and settings, got {node!r}"
            )
    body = {k: v for k, v in data.items() if k != "defaults"}
    body["nodes"] = [_merge(defaults, n) for n in nodes]
    try:
        manifest = SwarmManifest(**body)
    except ValidationError as exc:
        raise ConfigError("\n".join(["invalid swarm manifest:", *validation_lines(exc)])) from None
    _check_settings(manifest)
    return manifest


def validation_lines(exc: ValidationError) -> list[str]:
    """One line per problem, named by its manifest key. pydantic adds "nodes: should have at least 1 item"
    when every node failed, which reads as if the manifest had none: left out when nodes failed."""
    errors = exc.errors()
    node_failed = any(len(err["loc"]) > 1 and err["loc"][0] == "nodes" for err in errors)
    return [
        f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
        for err in errors
        if not (node_failed and tuple(err["loc"]) == ("nodes",) and err["type"] == "too_short")
    ]


def load_manifest(path: Path) -> SwarmManifest:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:  # a file that is not UTF-8 text, too
        raise ConfigError(f"cannot read swarm manifest {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"swarm manifest {path} is not valid YAML: {exc}") from None
    return parse_manifest(data)
