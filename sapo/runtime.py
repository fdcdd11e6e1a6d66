"""What every service process sets up before its own loop, and tears down in reverse order after it.

`configure` then `serve` is the one shape of the three entrypoints: arguments (`--help` only: services
are configured through the environment) -> settings -> runtime -> the service, built from both -> run
until SIGTERM -> close the service -> close the runtime. An entrypoint imports its service (torch and
transformers: seconds) only after `configure`, so bad settings fail as fast as the sampler's. Before its
loop runs, what the process built to start is frozen out of the garbage collector's full passes
(`freeze_startup_objects`).

Order on start: logging -> resolved config logged (secrets masked) -> registry and metrics -> compute
gate (`sapo.cpugate`, where set) -> signal handlers -> producers -> ops server -> port file. A start
that fails on the way (a port in use, a port file that cannot be written) closes what it had opened.
Order on stop (SIGTERM sets the stop flag; the loop finishes its unit and commits): the service closes
its consumers -> flush producers (bounded) -> stop the ops server -> close the gate's files. From the
stop on, each wait for the broker lasts at most `stop_broker_wait_s`, and none once one ran out
(`sapo.lifecycle.StopFlag.deadline`): with the broker gone, a stop takes the unit in hand plus seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Histogram,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sapo.cpugate import ComputeGate, Gate, NoGate
from sapo.cpuslice import request_cpu_slice
from sapo.kafka import DeadLetters, KafkaConsumerClient, KafkaPublisher, KafkaReaderClient, TransportMetrics
from sapo.kafka.chunks import chunk_size
from sapo.lifecycle import StopFlag, install_signal_handlers
from sapo.ops import Health, OpsServer, configure_logging
from sapo.settings import ConfigError, ServiceSettings, describe, env_fields, env_prefix, load_settings
from sapo.topics import TopicNames

log = logging.getLogger(__name__)
FLUSH_TIMEOUT_S = 10.0
S = TypeVar("S", bound=ServiceSettings)


class Service(Protocol):
    """What `serve` runs: built from settings and runtime, run until stopped, then closed."""

    def run(self) -> Any:
        """Work until the runtime's stop flag is set."""
        ...

    def close(self) -> None:
        """Commit what is finished and leave the consumer groups."""
        ...


def consumer_group(prefix: str, node_id: str, role: str) -> str:
    """The consumer group of one role of a node: `<prefix>.<node>.<role>` (the chart's ACLs allow the
    `<prefix>.<node>.` prefix)."""
    return f"{prefix}.{node_id}.{role}"


@dataclass
class Runtime:
    """The shared plumbing of one service process."""

    service: str
    settings: ServiceSettings
    topics: TopicNames
    registry: CollectorRegistry
    health: Health
    stop: StopFlag
    transport: TransportMetrics
    publisher: KafkaPublisher
    swarm_publisher: KafkaPublisher
    dead_letters: DeadLetters
    ops: OpsServer
    gate: Gate
    """The host-wide compute gate the service's model calls pass through (`sapo.cpugate`)."""

    def consumer(
        self, role: str, *, swarm: bool = False, per_process: bool = False, watch: bool = False
    ) -> KafkaConsumerClient:
        """A consumer in group `<prefix>.<node>.<role>`; per_process for a stream every replica must see
        whole (the policy topic, the leases, a history read from the beginning): a reader in no group
        (`KafkaReaderClient`), named `<group>.<random>`; watch for a stream no round waits on (its
        fetches wait `watch_fetch_wait_max_ms`)."""
        conn = self.settings.swarm_connection if swarm else self.settings.kafka
        group = consumer_group(self.settings.topic_prefix, self.settings.node_id, role)
        config = conn.to_librdkafka() | self.settings.consumer.to_librdkafka(watch=watch)
        lag = self.transport.consumer_lag
        cluster = "swarm" if separate_swarm(self.settings, swarm) else "node"
        brokers = self.transport.brokers_up.client(cluster)
        setting = bootstrap_setting(self.settings, swarm=swarm)
        if per_process:
            return KafkaReaderClient(
                config, f"{group}.{uuid.uuid4().hex[:12]}", lag=lag, brokers_up=brokers, setting=setting
            )
        return KafkaConsumerClient(config, group, lag=lag, brokers_up=brokers, setting=setting)

    def close(self) -> None:
        self.publisher.flush(FLUSH_TIMEOUT_S)
        if self.swarm_publisher is not self.publisher:
            self.swarm_publisher.flush(FLUSH_TIMEOUT_S)
        self.ops.stop()
        self.gate.close()


def separate_swarm(settings: ServiceSettings, swarm: bool) -> bool:
    """Whether a stream is on a swarm cluster of its own (`SWARM_KAFKA`), not the node's."""
    return swarm and settings.swarm_kafka is not None


def bootstrap_setting(settings: ServiceSettings, *, swarm: bool = False) -> str:
    """The variable a service's (or its swarm cluster's) `bootstrap.servers` comes from."""
    prefix = env_prefix(settings)
    own = f"{prefix}KAFKA__BOOTSTRAP_SERVERS"
    return f"{prefix}SWARM_KAFKA__BOOTSTRAP_SERVERS" if separate_swarm(settings, swarm) else own


def gate_waits(service: str, registry: CollectorRegistry) -> Histogram:
    """`sapo_<service>_compute_gate_wait_seconds`: declared where the service has a gate."""
    return Histogram(
        f"sapo_{service}_compute_gate_wait_seconds",
        "Wait for a slot of the host-wide compute gate before a model call (sapo.cpugate).",
        buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        registry=registry,
    )


def open_gate(service: str, settings: ServiceSettings, registry: CollectorRegistry) -> Gate:
    """The compute gate `settings` name, its waits in `gate_waits`."""
    if settings.compute_gate_dir is None:
        return NoGate()
    waits = gate_waits(service, registry)
    try:
        gate = ComputeGate.open(settings.compute_gate_dir, settings.compute_gate_slots, waits.observe)
    except OSError as exc:
        prefix = env_prefix(settings)
        raise ConfigError(
            f"{prefix}COMPUTE_GATE_DIR={settings.compute_gate_dir}: cannot open the compute "
            f"gate's lock files ({exc.strerror or exc}); set a writable directory, or unset it for no gate"
        ) from None
    log.info("compute gate %s: %d slot(s)", settings.compute_gate_dir, gate.slots)
    return gate


def open_ops_server(settings: ServiceSettings, registry: CollectorRegistry, health: Health) -> OpsServer:
    """The /metrics /healthz /readyz server, listening; an address it cannot take fails the start."""
    try:
        return OpsServer(registry, health, settings.http_host, settings.http_port).start()
    except OSError as exc:
        prefix = env_prefix(settings)
        host, port = settings.http_host, settings.http_port
        raise ConfigError(
            f"{prefix}HTTP_PORT={port}: cannot listen on {host}:{port} ({exc.strerror or exc}); set a "
            f"free port (0 picks one), or {prefix}HTTP_HOST to an address of this host"
        ) from None


def open_publisher(
    settings: ServiceSettings, transport: TransportMetrics, stop: StopFlag, *, swarm: bool = False
) -> KafkaPublisher:
    """The producer of the node's (or the swarm's) cluster, its waits bounded once `stop` is set.
    librdkafka checks its properties (EXTRA ones, the SASL mechanism, the TLS files) only when a client
    is created: one it refuses fails the start naming the variables, before any connection."""
    conn = settings.swarm_connection if swarm else settings.kafka
    try:
        return KafkaPublisher(
            conn.to_librdkafka(),
            transport,
            max_message_bytes=settings.max_message_bytes,
            setting=bootstrap_setting(settings, swarm=swarm),
            stop=stop,
        )
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        said = error.str() if isinstance(error, KafkaError) else str(exc)
        name = env_prefix(settings) + (
            "SWARM_KAFKA" if swarm and settings.swarm_kafka is not None else "KAFKA"
        )
        raise ConfigError(
            f"{name}__*: the Kafka client refuses these settings ({said}); check {name}__EXTRA (librdkafka "
            f"properties), {name}__SASL_MECHANISM and the files {name}__SSL_* name"
        ) from None


def write_port_file(settings: ServiceSettings, port: int) -> None:
    """Write the bound port to HTTP_PORT_FILE: whole, then renamed, so a supervisor polling for it never
    reads a partial number. A path that cannot be written fails the start naming the variable."""
    path = settings.http_port_file
    if path is None:
        return
    tmp = None
    try:
        tmp = path.with_suffix(".tmp")  # ValueError for a path with no name ('', '/')
        tmp.write_text(str(port))
        tmp.rename(path)
    except (OSError, ValueError) as exc:
        if tmp is not None and tmp.is_file():
            tmp.unlink()
        reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else "it names no file"
        raise ConfigError(
            f"{env_prefix(settings)}HTTP_PORT_FILE={str(path)!r}: cannot write the bound port there "
            f"({reason}); set the path of a file in a writable directory, or unset it"
        ) from None


def start_runtime(
    service: str, settings: ServiceSettings, *, refusals: Sequence[str] = (), install_signals: bool = True
) -> Runtime:
    """The runtime of one service process; `refusals` is every reason its loops reject or dead-letter a
    record for, exposed at 0 from the start (`sapo.kafka.TransportMetrics`)."""
    configure_logging(settings.log_level, settings.log_format, service, settings.node_id)
    log.info("starting %s with %s", service, describe(settings))
    request_cpu_slice(settings.cpu_slice_ms)  # before the server's and clients' threads: they inherit it
    registry = CollectorRegistry()
    # The default process_* (CPU, memory, fds, start time: the alerts' warm-up) and python_* series.
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    health = Health()
    transport = TransportMetrics(registry, service, refusals)
    with contextlib.ExitStack() as opened:  # a start that fails closes what it opened, newest first
        gate = open_gate(service, settings, registry)
        opened.callback(gate.close)
        stop = StopFlag(settings.stop_broker_wait_s)
        if install_signals:
            install_signal_handlers(stop)
        # The clients first: one refusing its settings ends the start before a port file names a server.
        publisher = open_publisher(settings, transport, stop)
        opened.callback(publisher.close, 0.0)
        swarm_publisher = publisher
        if settings.swarm_kafka is not None:
            swarm_publisher = open_publisher(settings, transport, stop, swarm=True)
            opened.callback(swarm_publisher.close, 0.0)
        ops = open_ops_server(settings, registry, health)
        opened.callback(ops.stop)
        log.info("ops server on :%d (/metrics /healthz /readyz)", ops.port)
        if settings.http_port_file is not None:
            write_port_file(settings, ops.port)
        limit = settings.max_message_bytes
        topics = TopicNames.for_node(settings.node_id, settings.topic_prefix)
        runtime = Runtime(
            service=service,
            settings=settings,
            topics=topics,
            registry=registry,
            health=health,
            stop=stop,
            transport=transport,
            publisher=publisher,
            swarm_publisher=swarm_publisher,
            dead_letters=DeadLetters(
                publisher, topics.dlq, service, transport, max_value_bytes=chunk_size(limit)
            ),
            ops=ops,
            gate=gate,
        )
        opened.pop_all()  # started: `Runtime.close` closes them from here on
    return runtime


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None or field.default is PydanticUndefined:
        return "see description"
    if field.default is None:
        return "unset"
    value = field.default.value if isinstance(field.default, Enum) else field.default
    return f"default {value}"


def settings_help(settings_class: type[ServiceSettings]) -> str:
    """Every environment variable the settings class reads, with its default and description."""
    prefix = env_prefix(settings_class)
    rows = [
        (prefix + env, f"{_default(f)}; {f.description or ''}".rstrip("; "))
        for env, f in env_fields(settings_class).items()
    ]
    width = max(len(variable) for variable, _ in rows)
    return "settings (environment variables):\n" + "\n".join(
        f"  {v.ljust(width)}  {text}" for v, text in rows
    )


def parse_service_args(name: str, settings_class: type[ServiceSettings], argv: Sequence[str] | None) -> None:
    """Print the help and exit 0 on -h/--help; exit 2 on any other argument (a stray `args:` in a
    deployment fails loudly at start); return otherwise."""
    doc = (settings_class.__doc__ or "").strip().splitlines()
    parser = argparse.ArgumentParser(
        prog=f"sapo-{name}",
        description=doc[0] if doc else None,
        epilog=settings_help(settings_class),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)


def freeze_startup_objects() -> None:
    """Move everything alive once a service is built (imported libraries, its model, its recovered
    state: it all lives as long as the process) out of the cyclic garbage collector's reach, after
    collecting what start-up left behind. Otherwise every full collection rescans it: ~470,000
    objects and 0.4 s of a sampler process's loop, measured on a 2-core machine (bench_sampler)."""
    gc.collect()
    gc.freeze()


def configure(name: str, settings_class: type[S], argv: Sequence[str] | None = None) -> S:
    """A service's settings, after its arguments (`--help` only). Bad configuration raises
    `ConfigError`, which exits with the message saying what to set."""
    parse_service_args(name, settings_class, argv)
    return load_settings(settings_class)


def serve(
    name: str,
    settings: S,
    prepare: Callable[[S], Callable[[Runtime], Service | None]],
    refusals: Sequence[str],
) -> int:
    """Run one service process; exit status 0 on a clean stop. `refusals`: the service's catalogue of
    reasons for rejecting a record (`start_runtime`). `prepare` checks what must be on this
    machine (a model, a key) before any connection opens, so its message (a `ConfigError`) is the last
    thing the process prints rather than racing a Kafka client's connection log; it returns what builds
    the service on the runtime, which returns None when the process was stopped while starting
    (nothing was consumed)."""
    build = prepare(settings)
    runtime = start_runtime(name, settings, refusals=refusals)
    try:
        service = build(runtime)
        if service is None:
            return 0
        freeze_startup_objects()
        try:
            service.run()
        finally:
            service.close()
    finally:
        runtime.close()
    return 0
