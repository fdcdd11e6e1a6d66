"""Typed, frozen settings shared by every service.

Each service subclasses `ServiceSettings` with its own env prefix (`SAPO_GENERATOR_`, ...). Nested
models use `__` in env names: `SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS=broker:9092`. Kafka settings
stay a typed model until the edge, where `KafkaConnection.to_librdkafka()` turns them into the
librdkafka dict; secrets are `SecretStr` so the resolved config can be logged.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import types
import typing
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Self, TypeVar

import annotated_types
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sapo.cliargs import broker_addresses, check_brokers
from sapo.cpuslice import DEFAULT_SLICE_MS, MAX_SLICE_MS
from sapo.identity.settings import IdentitySettings
from sapo.topics import DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, MIN_MESSAGE_BYTES, NODE_ID_PATTERN

log = logging.getLogger(__name__)


class ConfigError(SystemExit):
    """Raised at start when configuration is invalid; the message says what to set."""


BROKER_LIST_PROPERTIES: Final = frozenset({"bootstrap.servers", "metadata.broker.list"})
"""The librdkafka properties that name the brokers (the second is the first's alias)."""


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class KafkaConnection(BaseModel):
    """How to reach one Kafka cluster (the node's own, or the swarm's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="Comma-separated host:port list of the brokers (its form is checked at start; a name "
        "need not resolve yet).",
    )
    security_protocol: SecurityProtocol = Field(
        SecurityProtocol.PLAINTEXT, validate_default=True, description="Transport security."
    )
    sasl_mechanism: str | None = Field(
        None, description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (masked in logs).")
    ssl_ca_location: str | None = Field(None, description="Path of the CA bundle that signed the brokers.")
    ssl_certificate_location: str | None = Field(None, description="Client certificate for mutual TLS.")
    ssl_key_location: str | None = Field(None, description="Client private key for mutual TLS.")
    ssl_key_password: SecretStr | None = Field(None, description="Password of the client key (masked).")
    client_id: str = Field("sapo-swarm", description="client.id reported to the brokers.")
    extra: dict[str, str] = Field(
        default_factory=dict, description="Additional librdkafka properties, passed through unchanged."
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _broker_list(cls, value: str) -> str:
        """The form of the list only (`sapo.cliargs.broker_addresses`), never a name lookup: a service
        must start while its brokers' names do not resolve yet (a cluster's DNS still starting). A
        malformed list would fail only as a transport error that never ends (librdkafka takes port
        99999 as 34463, and drops a broker it cannot parse)."""
        broker_addresses(value)
        return value

    @field_validator("extra")
    @classmethod
    def _no_second_broker_list(cls, value: dict[str, str]) -> dict[str, str]:
        """`extra` may not name the brokers: they are `bootstrap_servers`, which is checked."""
        named = sorted(BROKER_LIST_PROPERTIES & set(value))
        if named:
            raise ValueError(
                f"{named[0]} is the brokers: set KAFKA__BOOTSTRAP_SERVERS (a command's --bootstrap), "
                "not an extra property"
            )
        return value

    @field_validator("security_protocol")
    @classmethod
    def _schemes_are_the_protocol(cls, value: SecurityProtocol, info: ValidationInfo) -> SecurityProtocol:
        """No broker names a `SCHEME://` other than the security protocol. A check of this field (its
        default included), so that an error names the setting to change, the variable or a command's
        `--security-protocol`, not the whole connection's variable; the brokers are checked before it."""
        servers = info.data.get("bootstrap_servers")
        if servers is None:  # refused itself, and reported so
            return value
        protocol = SecurityProtocol(value).value
        for address in broker_addresses(servers):
            if address.scheme is not None and address.scheme != protocol:
                raise ValueError(
                    f"KAFKA__BOOTSTRAP_SERVERS names the scheme {address.scheme}:// but security_protocol "
                    f"is {protocol}: the Kafka client drops such a broker; set KAFKA__SECURITY_PROTOCOL="
                    f"{address.scheme} (a command's --security-protocol), or leave the scheme out"
                )
        return value

    @model_validator(mode="after")
    def _check_security(self) -> Self:
        uses_sasl = self.security_protocol in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)
        if uses_sasl and not self.sasl_mechanism:
            raise ValueError(
                f"security_protocol={self.security_protocol} needs sasl_mechanism; set KAFKA__SASL_MECHANISM"
            )
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
            self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                f"sasl_mechanism={self.sasl_mechanism} needs KAFKA__SASL_USERNAME and KAFKA__SASL_PASSWORD"
            )
        return self

    def to_librdkafka(self) -> dict[str, str]:
        """The librdkafka property dict; the only place secrets are unwrapped."""
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol.value,
            "client.id": self.client_id,
        }
        optional: dict[str, str | SecretStr | None] = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        for key, value in optional.items():
            if value is not None:
                conf[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return conf | self.extra


class ConsumerProfile(BaseModel):
    """Consumer timing knobs. Defaults suit Apache Kafka; `local()` gives the embedded broker's values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_timeout_ms: int = Field(45000, ge=1000, le=3_600_000, description="Group session timeout.")
    heartbeat_interval_ms: int = Field(3000, ge=100, le=600_000, description="Group heartbeat interval.")
    fetch_wait_max_ms: int = Field(500, ge=1, le=60_000, description="Longest a fetch waits for data.")
    watch_fetch_wait_max_ms: int = Field(
        500,
        ge=1,
        le=60_000,
        description="Longest a fetch of a watching consumer waits: the leases, the sampler's view of its "
        "trainer and the launcher's recorder, streams no round waits on. On a broker that never answers a "
        "waiting fetch early (the embedded one) a longer wait costs these readers latency only, and every "
        "empty fetch costs the broker CPU.",
    )
    max_poll_interval_ms: int = Field(
        900_000, ge=10_000, le=86_400_000, description="Longest gap between polls (covers a training step)."
    )
    statistics_interval_ms: int = Field(
        10_000,
        ge=0,
        le=3_600_000,
        description="How often librdkafka's statistics refresh the consumer_lag_messages and "
        "kafka_brokers_up gauges (0: no statistics, neither gauge).",
    )

    @classmethod
    def local(cls) -> ConsumerProfile:
        """The embedded tansu broker: each group join takes session.timeout/2 and fetches are never
        woken early (docs/architecture.md), so short timeouts keep tests and local swarms responsive."""
        return cls(
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            fetch_wait_max_ms=50,
            watch_fetch_wait_max_ms=500,
        )

    @classmethod
    def local_swarm(cls) -> ConsumerProfile:
        """A swarm the launcher runs on the embedded broker: `local()` with 500 ms fetch waits on a
        round's path and 1.5 s for the watchers. Its consumers share the machine with the models, and
        each fetch costs the broker about half a millisecond of CPU (more per partition it names) even
        when it returns nothing, and wakes it between the model calls; a lock-step round waits on three
        hops, so a longer wait costs latency (~0.25 s a hop on average at 500 ms, hidden while other
        nodes' model calls keep the CPUs busy) and saves CPU. bench_pipeline.py's services, 4 nodes on
        one CPU, s per round: 7.58 at 200 ms against 8.41 at 50; 4.94-6.63 at 500 ms against 5.59-6.89
        at 200, each pair run back to back (4 pairs, -4% to -13%; the broker's CPU -25% for the same
        training steps; side by side with an in-process run, no shorter round, the services' CPU 6-12%
        less); 1000 ms saved the broker more CPU but no round time. The watchers (a node's
        two leases and its sampler's view of its trainer, and the launcher's recorder) hold no round
        up, and the watch wait stays below `lease_read_idle_s` (2 s), how long a lease reader waits for
        a record before it counts the topic as read. Tests keep `local()`: few consumers, and latency
        is their wall time."""
        return cls.local().model_copy(update={"fetch_wait_max_ms": 500, "watch_fetch_wait_max_ms": 1500})

    @classmethod
    def local_durable(cls) -> ConsumerProfile:
        """The embedded broker on `s3://` storage: every fetch lists all stored batches of the partition,
        and a fetch that waits less than that listing takes returns nothing, every time; 2 s covers a
        partition of about a thousand batches on a loopback S3."""
        return cls(
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            fetch_wait_max_ms=2000,
            watch_fetch_wait_max_ms=2000,
        )

    def to_librdkafka(self, *, watch: bool = False) -> dict[str, str]:
        """The client settings; `watch` for a consumer of a stream no round waits on."""
        return {
            "session.timeout.ms": str(self.session_timeout_ms),
            "heartbeat.interval.ms": str(self.heartbeat_interval_ms),
            "fetch.wait.max.ms": str(self.watch_fetch_wait_max_ms if watch else self.fetch_wait_max_ms),
            "max.poll.interval.ms": str(self.max_poll_interval_ms),
            "statistics.interval.ms": str(self.statistics_interval_ms),
        }


class RoundSettings(BaseModel):
    """What the generator and the sampler both know of a round: declared here once, so the two agree."""

    questions_per_round: int = Field(
        8,
        ge=1,
        le=1024,
        description="B: questions a node generates per round (the generator draws them; a lock-step "
        "sampler waits for that many local groups of a round).",
    )


MAX_LEASE_TTL_S: Final = 3600.0
"""The longest lease ttl a process may be set to; readers refuse a lease record with a longer one."""


class LeaseSettings(BaseModel):
    """The single-writer lease of a sampler or trainer (`sapo.node.lease`), declared once for both."""

    lease_ttl_s: float = Field(
        30.0,
        ge=3.0,
        le=MAX_LEASE_TTL_S,
        description="A lease not renewed for this long may be taken by a standby (renewed every third of "
        "it); also how long a standby waits after a holder dies without releasing.",
    )
    lease_read_idle_s: float = Field(
        2.0,
        ge=0.05,
        le=120.0,
        description="The leases topic counts as read once nothing arrived for this long (longer than a "
        "fetch wait; the embedded broker's high watermark is not trusted).",
    )


class PeerMetricsSettings(BaseModel):
    """How many peers get their own label in the per-peer metrics of the sampler and the trainer
    (`sapo.node.peers`), declared once for both."""

    metrics_peers: int = Field(
        16,
        ge=0,
        le=256,
        description="Peers with their own `peer` label in the per-peer contribution metrics: the first "
        "this many peers whose groups passed the sampler's filters or were trained on by the trainer, for "
        "the life of the process; every other peer is "
        'counted under peer="_other" (the node\'s own id always has its label). Bounds the series '
        "count; `sapo report` has every peer.",
    )


class LogFormat(StrEnum):
    JSON = "json"
    TEXT = "text"


class ServiceSettings(BaseSettings):
    """Settings every service has. Subclasses set `model_config` with their own env prefix."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_nested_delimiter="__")

    node_id: str = Field(..., pattern=NODE_ID_PATTERN, description="This node's id (lowercase, digits, '-').")
    kafka: KafkaConnection = Field(default_factory=KafkaConnection, description="The node's own cluster.")
    swarm_kafka: KafkaConnection | None = Field(
        None, description="Cluster of the swarm topic; unset = the node's own cluster."
    )
    consumer: ConsumerProfile = Field(default_factory=ConsumerProfile, description="Consumer timing.")
    topic_prefix: str = Field("sapo", pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Prefix of topic names.")
    http_host: str = Field("0.0.0.0", description="Address of the /metrics /healthz /readyz server.")
    http_port: int = Field(8080, ge=0, le=65535, description="Port of that server; 0 = pick a free one.")
    http_port_file: Path | None = Field(
        None, description="Write the bound port here (for supervisors that start services with port 0)."
    )
    log_level: str = Field(
        "INFO",
        pattern=r"^(DEBUG|INFO|WARNING|ERROR|debug|info|warning|error)$",
        description="Log level (either case).",
    )
    log_format: LogFormat = Field(LogFormat.JSON, description="json for clusters, text for terminals.")
    cpu_slice_ms: float = Field(
        DEFAULT_SLICE_MS,
        ge=0.0,
        le=MAX_SLICE_MS,
        description="CPU time slice every thread of the process asks the kernel for (Linux 6.12+, "
        "`sapo.cpuslice`): on a CPU shared with other busy processes, a thread that wakes (a Kafka "
        "client's, the HTTP server's) waits for the running one's slice instead of preempting a model "
        "step. 0 = the kernel's default slice.",
    )
    compute_gate_dir: Path | None = Field(
        None,
        description="Directory of the host-wide compute gate (`sapo.cpugate`): services that share a "
        "host's CPUs and name the same directory run at most compute_gate_slots model calls (generation "
        "calls, training steps) at once, so that calls do not slow each other down by taking turns on a "
        "CPU. `sapo swarm` sets it for its services unless its environment does; unset or empty "
        "(Kubernetes: each pod has its own CPUs) = no limit.",
    )
    compute_gate_slots: int = Field(
        1,
        ge=1,
        le=4096,
        description="Model calls the compute gate lets run at once: the CPUs the services share.",
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=MIN_MESSAGE_BYTES,
        le=MAX_MESSAGE_BYTES,
        description="Largest Kafka message this service produces: the brokers' and topics' limit (Apache "
        "Kafka's default ~1 MB; `sapo topics --max-message-bytes` and the chart's maxMessageBytes create "
        "topics with the same value). Larger payloads go out in chunks that consumers reassemble.",
    )
    max_payload_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        le=4 * 1024 * 1024 * 1024,
        description="Largest payload (a group, a batch, after reassembly) this service accepts; larger "
        "ones are counted and dead-lettered. Bounds memory against a hostile or broken peer.",
    )
    stop_broker_wait_s: float = Field(
        5.0,
        gt=0.0,
        le=60.0,
        description="Once stopping (SIGTERM), the longest each wait for the Kafka broker lasts (an "
        "acknowledgement of the unit in hand's output or of the lease's release, the final flush, a "
        "consumer's close with its final commit), counted for a produce from its latest acknowledgement "
        "(a broker that keeps acknowledging, only slowly, is waited for up to the wait's own timeout); "
        "after one acknowledgement did not come in time, none waits again. What the broker did not "
        "acknowledge is not committed and is redone after the "
        "restart. A broker that is up answers in milliseconds; this bounds a stop with the broker gone to "
        "the unit in hand plus a few seconds, well within the chart's terminationGracePeriodSeconds.",
    )
    identity: IdentitySettings = Field(
        default_factory=IdentitySettings,
        description="This node's key and whom it trusts (IDENTITY__MODE, IDENTITY__PRIVATE_KEY_FILE, "
        "IDENTITY__TRUST_FILE, ...; sapo.identity.settings).",
    )

    @field_validator("compute_gate_dir", mode="before")
    @classmethod
    def _empty_is_no_gate(cls, value: object) -> object:
        """`COMPUTE_GATE_DIR=` turns off the gate a supervisor would set (an empty path would name the
        working directory)."""
        return None if value == "" else value

    @field_validator("log_level", mode="after")
    @classmethod
    def _level_name(cls, value: str) -> str:
        return value.upper()  # the name `logging` knows

    @property
    def swarm_connection(self) -> KafkaConnection:
        return self.swarm_kafka or self.kafka


S = TypeVar("S", bound=BaseSettings)


def field_types(info: FieldInfo) -> list[Any]:
    """The member types of a field's annotation (`X | None` -> [X, NoneType])."""

    def members(annotation: Any) -> list[Any]:
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            return [m for a in typing.get_args(annotation) for m in members(a)]
        return [annotation]

    return members(info.annotation)


_BOUND_TYPES = (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt)


def field_bounds(info: FieldInfo) -> dict[str, int | float]:
    """A numeric field's declared bounds by their `Field` names: `ge`, `gt`, `le`, `lt` (each kept by
    annotated_types as a class of that name, the bound under the lower-case name)."""
    return {
        kind: getattr(m, kind)
        for m in info.metadata
        if isinstance(m, _BOUND_TYPES) and (kind := type(m).__name__.lower())
    }


def env_fields(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every setting of a settings class by its env name after the service prefix (nested models'
    fields joined with `__`, as pydantic-settings reads them): what --help lists and the chart's
    values schema accepts."""
    fields: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        nested = [m for m in field_types(info) if isinstance(m, type) and issubclass(m, BaseModel)]
        if nested:
            fields |= env_fields(nested[0], f"{env}__")
        else:
            fields[env] = info
    return fields


def unknown_env(cls: type[BaseSettings], environ: Mapping[str, str]) -> list[str]:
    """Variables with the class's prefix that name no field: pydantic-settings ignores them silently,
    so a misspelled setting would otherwise run with its default."""
    prefix = env_prefix(cls)
    if not prefix:
        return []
    fields = set(cls.model_fields)
    return sorted(
        name
        for name in environ
        if name.upper().startswith(prefix) and name[len(prefix) :].split("__")[0].lower() not in fields
    )


def _near(unknown: list[str], prefix_len: int, cls: type[BaseSettings]) -> list[tuple[str, str]]:
    """Each unknown variable with the field name (upper case) it most likely misspells, where one is
    close: the part after the prefix and before any nested `__` is compared."""
    fields = [f.upper() for f in cls.model_fields]
    out = []
    for name in unknown:
        head = name[prefix_len:].upper().split("__")[0]
        close = difflib.get_close_matches(head, fields, n=1, cutoff=0.75)
        if close:
            out.append((name, close[0]))
    return out


def env_prefix(settings: BaseSettings | type[BaseSettings]) -> str:
    """The prefix of a settings class's environment variables (`SAPO_SAMPLER_`)."""
    cls = settings if isinstance(settings, type) else type(settings)
    return str(cls.model_config.get("env_prefix", ""))


def load_settings(cls: type[S], flags: Mapping[str, str] | None = None, /, **overrides: Any) -> S:
    """Build settings from the environment (and overrides), or exit with every problem and what to set.
    `flags` maps a field a command-line flag gave to that flag (`timeout_s` -> `--timeout`): a problem
    with it names the flag the user typed, not the variable it overrode. (Positional-only, so that no
    override is taken for it.)"""
    unknown = unknown_env(cls, os.environ)
    if unknown:
        prefix = env_prefix(cls)
        names = [f"{prefix}{f.upper()}" for f in cls.model_fields]
        hints = "".join(
            f"\n  {name}: did you mean {prefix}{close}?" for name, close in _near(unknown, len(prefix), cls)
        )
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)} for {cls.__name__}{hints}\nknown: {', '.join(names)}"
        )
    try:
        return cls(**overrides)
    except SettingsError as exc:  # a variable of a collection or nested model that is not JSON
        raise ConfigError(_not_json(cls, exc)) from None
    except ValidationError as exc:
        prefix = env_prefix(cls)
        lines = [f"invalid configuration for {cls.__name__}:"]
        for err in exc.errors():
            path = "__".join(str(p) for p in err["loc"]).upper()
            env = f"{prefix}{path}" if path else prefix + "*"
            where = (flags or {}).get(".".join(str(p) for p in err["loc"]), env)
            hint = _COLLECTION_HINTS.get(err["type"], "") if isinstance(err.get("input"), str) else ""
            shown = _shown_input(cls, err["loc"], err.get("input"))
            if err["type"] == "extra_forbidden":  # no field: perhaps a misspelled secret, never shown
                hint, shown = _nested_hint(cls, path), "value not shown"
            lines.append(f"  {where}: {err['msg']} ({shown}){hint}")
        raise ConfigError("\n".join(lines)) from None


def check_command_brokers(settings: BaseSettings, flags: Mapping[str, str] | None = None, /) -> None:
    """For a command, never a service: every host of each Kafka connection of `settings` resolves now
    (`sapo.cliargs.check_brokers`, the rule of its `--bootstrap` flag), whichever source gave the list;
    else `ConfigError` naming that source: the flag (`flags`, as for `load_settings`), the environment
    variable by its exact name, or the default. A command uses its brokers at once, and librdkafka reports
    an unknown host only as a generic transport failure after the command's whole timeout; a service
    waits for names that resolve later (the form alone is checked at load, `KafkaConnection`)."""
    cls = type(settings)
    for name in cls.model_fields:
        connection = getattr(settings, name)
        if not isinstance(connection, KafkaConnection):
            continue
        try:
            check_brokers(connection.bootstrap_servers)
        except ValueError as exc:
            loc = (name, "bootstrap_servers")
            where = (flags or {}).get(".".join(loc)) or env_source(cls, loc, os.environ)
            if where is None:
                where = f"{env_prefix(cls)}{'__'.join(loc).upper()} (unset: the default)"
            raise ConfigError(f"{where}: {exc}") from None


def env_source(cls: type[BaseSettings], loc: tuple[str, ...], environ: Mapping[str, str]) -> str | None:
    """The environment variable, by its exact name, that gave the field at `loc` of `cls` (`kafka`,
    `bootstrap_servers`): its own (`SAPO_X_KAFKA__BOOTSTRAP_SERVERS`, any case, as pydantic-settings
    reads it) or else the enclosing model's, which holds JSON (`SAPO_X_KAFKA`); None when none did."""
    names = {name.upper(): name for name in environ}
    for depth in range(len(loc), 0, -1):
        name = names.get(env_prefix(cls).upper() + "__".join(loc[:depth]).upper())
        if name is not None:
            return name
    return None


def _nested_hint(cls: type[BaseSettings], path: str) -> str:
    """What a variable naming no field of a nested model (`KAFKA__BOOTSTRAP_SERVER`) most likely
    misspells, else the fields that model has: "Extra inputs are not permitted" says neither."""
    parent = path.rpartition("__")[0]
    if not parent:
        return ""
    prefix = env_prefix(cls)
    siblings = [name for name in env_fields(cls) if name.startswith(f"{parent}__")]
    close = difflib.get_close_matches(path, siblings, n=1, cutoff=0.75)
    if close:
        return f"; did you mean {prefix}{close[0]}?"
    return f"; {prefix}{parent}__ takes: {', '.join(name.rpartition('__')[2] for name in siblings)}"


def _not_json(cls: type[BaseSettings], exc: SettingsError) -> str:
    """What to set when pydantic-settings could not decode a variable as JSON (it names only the field):
    every variable of that field whose text is not JSON, never its text (a nested model's may hold a
    secret)."""
    match = re.search(r'field "([^"]+)"', str(exc))
    field = match[1] if match else ""
    prefix = env_prefix(cls)
    head = f"{prefix}{field}".upper()
    nested = env_fields(cls)
    lines = [f"invalid configuration for {cls.__name__}:"]
    for name, value in sorted(os.environ.items()):
        upper = name.upper()
        if not (upper == head or upper.startswith(f"{head}__")):
            continue
        info = nested.get(upper[len(prefix) :])  # None: a nested model itself
        kinds = {typing.get_origin(t) or t for t in field_types(info)} if info is not None else set()
        if kinds & {list, tuple, set, frozenset}:
            hint = _COLLECTION_HINTS["list_type"]
        elif dict in kinds:
            hint = _COLLECTION_HINTS["dict_type"]
        elif info is None:
            hint = f"; give a JSON object, or set each field as {upper}__<FIELD>"
        else:
            continue  # plain text, never decoded
        try:
            json.loads(value)
        except ValueError as error:
            lines.append(f"  {name}: not valid JSON ({error.args[0] if error.args else error}){hint}")
    if len(lines) == 1:
        lines.append(f"  {head}: not valid JSON ({exc.__cause__ or exc})")
    return "\n".join(lines)


_COLLECTION_HINTS: Final = {
    kind: '; a variable holding a list is JSON, e.g. ["a", "b"]'
    for kind in ("list_type", "set_type", "frozen_set_type", "tuple_type")
} | {"dict_type": '; a variable holding a mapping is JSON, e.g. {"key": "value"}'}
"""What an error about a collection adds when it was given plain text: the environment's format."""


def _shown_input(model: type[BaseModel], loc: tuple[int | str, ...], value: Any) -> str:
    """What an error message shows of the value it refused: never a secret. A nested model's input
    (a dict that may hold a password) is shown by its keys only."""
    if isinstance(value, Mapping):
        return f"given: {', '.join(sorted(str(k) for k in value)) or 'nothing'}"
    info: FieldInfo | None = None
    for part in loc:
        if info is not None:
            nested = [m for m in field_types(info) if isinstance(m, type) and issubclass(m, BaseModel)]
            if not nested:
                break
            model = nested[0]
        info = model.model_fields.get(str(part))
        if info is None:
            break
    if info is not None and SecretStr in field_types(info):
        return "a secret, not shown"
    return f"got {value!r}"


def describe(settings: BaseSettings) -> dict[str, Any]:
    """The resolved configuration with secrets masked, for the start-up log line."""
    return settings.model_dump(mode="json")
