"""Topic names (docs/architecture.md, Topics) and idempotent topic creation.

Names are validated here against Apache Kafka's rules because tansu accepts names Kafka rejects
(spaces, '!'): a swarm that works locally must not fail on a real cluster over a topic name.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports NewTopic implicitly, which mypy --strict rejects; cimpl is its home.
from confluent_kafka.cimpl import NewTopic

from sapo.clientlog import LIBRDKAFKA_LOG

DEFAULT_PREFIX: Final = "sapo"
#: Node ids appear in topic names, consumer group ids and metric labels, so they stay short and
#: unambiguous; settings validate with the same pattern.
NODE_ID_PATTERN: Final = r"^[a-z0-9][a-z0-9-]{0,47}$"
NODE_ID_RE: Final = re.compile(NODE_ID_PATTERN)
PREFIX_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
#: Apache Kafka's legal topic names (kafka.common.internals.Topic).
TOPIC_NAME_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: The policy topic keeps only the latest PolicyUpdate per node id; the keys topic the last word on a key.
COMPACT: Final[Mapping[str, str]] = MappingProxyType({"cleanup.policy": "compact"})
DEFAULT_MAX_MESSAGE_BYTES: Final = 1024 * 1024
"""Apache Kafka's default per-message limit (~1 MB): what producers send at most, and what every topic
is created to accept, unless one value (settings: MAX_MESSAGE_BYTES; `sapo topics
--max-message-bytes`; the chart's `maxMessageBytes`) raises both. Larger payloads go out in chunks."""
MIN_MESSAGE_BYTES: Final = 64 * 1024
MAX_MESSAGE_BYTES: Final = 256 * 1024 * 1024
"""The bounds of that one value wherever it is set (settings, `sapo topics`, the chart's schema): below,
a chunk leaves no room for its headers; above, a single message outgrows what brokers are run with."""
WORK_PARTITIONS: Final = 8
"""Default partitions of a node's work topic: the most generator replicas that share its work (a
replica without a partition idles). Create the topic with more to run more replicas."""


class TopicError(RuntimeError):
    """Topics could not be listed or created; the message names each failing topic."""


def validate_node_id(node_id: str) -> str:
    """Return `node_id` if it is usable in topic names, else raise ValueError saying what to change."""
    if not NODE_ID_RE.fullmatch(node_id):
        raise ValueError(
            f"invalid node id {node_id!r}: use 1-48 characters of lowercase letters, digits and '-',"
            " starting with a letter or digit (for example 'node-0')"
        )
    return node_id


def validate_topic_name(name: str) -> str:
    """Return `name` if Apache Kafka accepts it as a topic name, else raise ValueError."""
    if not TOPIC_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ValueError(
            f"invalid topic name {name!r}: Kafka allows 1-249 characters of ASCII letters, digits, '.', '_'"
            " and '-' (and not '.' or '..')"
        )
    return name


@dataclass(frozen=True)
class TopicSpec:
    """One topic to create. `config` holds topic-level overrides such as cleanup.policy."""

    name: str
    partitions: int = 1
    replication_factor: int = 1
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_topic_name(self.name)
        if self.partitions < 1:
            raise ValueError(f"topic {self.name!r}: partitions must be >= 1, got {self.partitions}")
        if self.replication_factor < 1:
            raise ValueError(
                f"topic {self.name!r}: replication_factor must be >= 1, got {self.replication_factor}"
            )


@dataclass(frozen=True)
class TopicNames:
    """The topics one node uses. Build with `for_node`; override single names with `dataclasses.replace`."""

    node_id: str
    swarm_rollouts: str
    rollouts: str
    batches: str
    policy: str
    dlq: str
    swarm_keys: str
    work: str
    leases: str

    def __post_init__(self) -> None:
        validate_node_id(self.node_id)
        names = (self.swarm_rollouts, self.rollouts, self.batches, self.policy, self.dlq, self.swarm_keys)
        for name in (*names, self.work, self.leases):
            validate_topic_name(name)

    @classmethod
    def for_node(cls, node_id: str, prefix: str = DEFAULT_PREFIX) -> TopicNames:
        """The default names: `<prefix>.swarm.{rollouts,keys}` and `<prefix>.node.<id>.{rollouts,...}`."""
        validate_node_id(node_id)
        if not PREFIX_RE.fullmatch(prefix):
            raise ValueError(
                f"invalid topic prefix {prefix!r}: use 1-64 ASCII letters, digits, '.', '_' or '-'"
            )
        node = f"{prefix}.node.{node_id}"
        return cls(
            node_id=node_id,
            swarm_rollouts=f"{prefix}.swarm.rollouts",
            rollouts=f"{node}.rollouts",
            batches=f"{node}.batches",
            policy=f"{node}.policy",
            dlq=f"{node}.dlq",
            swarm_keys=f"{prefix}.swarm.keys",
            work=f"{node}.work",
            leases=f"{node}.leases",
        )

    def specs(
        self,
        partitions: int = 1,
        replication_factor: int = 1,
        work_partitions: int = WORK_PARTITIONS,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> list[TopicSpec]:
        """Specs for all eight topics; `partitions` applies to the swarm, rollout and DLQ topics, and
        every topic accepts messages of `max_message_bytes` (`max.message.bytes`: the producers' limit,
        so what a service may send, a topic accepts).

        The batch and policy topics always have one partition: a node's batches are its optimizer
        steps, trained in sequence order, and the policy topic carries one key (the node id) whose
        versions generators need in order. The keys topic (signed key announcements,
        `sapo.identity`) is compacted with one partition too: a rotation must be read after the
        admission it builds on. The leases topic (`sapo.node.lease`) is compacted with one partition:
        its offsets are the writers' epochs. The work topic has `work_partitions`, as many as the most
        generator replicas of the node.
        """
        rf, limit = replication_factor, {"max.message.bytes": str(max_message_bytes)}
        compact = dict(COMPACT) | limit
        return [
            TopicSpec(self.swarm_rollouts, partitions, rf, limit),
            TopicSpec(self.rollouts, partitions, rf, limit),
            TopicSpec(self.batches, 1, rf, limit),
            TopicSpec(self.policy, 1, rf, compact),
            TopicSpec(self.dlq, partitions, rf, limit),
            TopicSpec(self.swarm_keys, 1, rf, compact),
            TopicSpec(self.work, work_partitions, rf, limit),
            TopicSpec(self.leases, 1, rf, compact),
        ]


def _dedupe(specs: list[TopicSpec]) -> list[TopicSpec]:
    """Drop repeated identical specs (the swarm topic comes once per node); conflicting ones are an error."""
    by_name: dict[str, TopicSpec] = {}
    for spec in specs:
        seen = by_name.setdefault(spec.name, spec)
        if seen != spec:
            raise ValueError(
                f"topic {spec.name!r} is specified twice with different settings: {seen} vs {spec}"
            )
    return list(by_name.values())


def ensure_topics(admin_config: dict[str, str], specs: list[TopicSpec], timeout_s: float) -> list[str]:
    """Create the topics in `specs` that do not exist yet and return the names it created.

    Idempotent: existing topics are left as they are (their partitions and config are not checked),
    and a topic that another process creates concurrently (TOPIC_ALREADY_EXISTS) counts as success.
    Any other failure raises TopicError naming every topic that failed.
    """
    deadline = time.monotonic() + timeout_s
    wanted = _dedupe(specs)
    admin = AdminClient(dict(admin_config), logger=LIBRDKAFKA_LOG)
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        servers = admin_config.get("bootstrap.servers")
        raise TopicError(f"could not list topics at {servers} within {timeout_s} s: {exc}") from exc
    missing = [spec for spec in wanted if spec.name not in existing]
    if not missing:
        return []
    remaining = max(0.1, deadline - time.monotonic())
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config)) for s in missing],
        operation_timeout=remaining,
        request_timeout=remaining,
    )
    created: list[str] = []
    failures: list[str] = []
    for spec in missing:
        try:
            futures[spec.name].result(timeout=max(0.0, deadline - time.monotonic()))
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                failures.append(f"{spec.name}: {error.str()}")
            continue
        except TimeoutError:
            failures.append(f"{spec.name}: no answer within {timeout_s} s")
            continue
        created.append(spec.name)
    if failures:
        raise TopicError("could not create topics:\n  " + "\n  ".join(failures))
    return created
