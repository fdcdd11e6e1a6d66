"""What the three scenarios share: the service under test, sending as its neighbours would, the
checks every service answers the same way (headers, leases, dead letters), and what its consumer
groups say when it reacts to nothing in time (`unread`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import ConsumerGroupState
from google.protobuf.message import Message

from sapo.conformance.observe import Committed, Tail, group_state
from sapo.conformance.results import Results
from sapo.identity import TrustStore
from sapo.inspect.render import topic_label
from sapo.kafka import KafkaPublisher, Record
from sapo.kafka.dlq import H_DETAIL, H_REASON, H_SERVICE, H_SOURCE
from sapo.node.lease import RENEWED_AHEAD, Holder, fold, lease_problem
from sapo.runtime import consumer_group
from sapo.topics import TopicNames
from sapo.v1 import lease_pb2
from sapo.wire import H_NODE, H_SCHEMA, H_TYPE, SCHEMA_VERSION, InvalidMessageError, decode, header_str

M = TypeVar("M", bound=Message)
MAX_BYTES = 64 * 1024 * 1024
METADATA_TIMEOUT_S = 10.0
"""How long a metadata or offset request of the kit waits at most (`Target.metadata_timeout_s`)."""
Position = tuple[str, int, int]
"""(topic, partition, offset) of a message the kit sent."""


@dataclass(frozen=True)
class Target:
    """The running service the kit drives, and how patient it is.

    `kafka` is the connection (librdkafka properties); `timeout_s` bounds every wait for a
    reaction (the first one includes the service's start-up),
    `quiet_s` is how long the kit watches for something that must *not* happen (or must not happen
    yet), and `questions_per_round` is the service's setting of that name (the conformance profile,
    docs/contract.md section 11)."""

    service: str
    node: str
    prefix: str
    kafka: Mapping[str, str]
    timeout_s: float = 120.0
    quiet_s: float = 4.0
    questions_per_round: int = 3
    fetch_wait_max_ms: int = 100

    @property
    def consumer(self) -> dict[str, str]:
        """The connection as the kit's readers use it."""
        return dict(self.kafka) | {"fetch.wait.max.ms": str(self.fetch_wait_max_ms)}

    @property
    def topics(self) -> TopicNames:
        return TopicNames.for_node(self.node, self.prefix)

    @property
    def metadata_timeout_s(self) -> float:
        """How long a metadata or offset request waits: `METADATA_TIMEOUT_S`, or `timeout_s` when that
        is shorter (`--timeout 3` gives up on an unreachable broker after 3 s, not 10)."""
        return min(METADATA_TIMEOUT_S, self.timeout_s)

    def group(self, role: str) -> str:
        return consumer_group(self.prefix, self.node, role)


@dataclass(frozen=True)
class GeneratorTarget:
    """What the generator scenario needs beyond `Target`: the generator's model (the kit writes
    versions of it), the store it reads checkpoints from, and optionally the swarm's trust list (to
    verify the generator's signatures)."""

    model: str
    checkpoint_root: str
    trust: TrustStore | None = None


def unread(target: Target, watched: Sequence[tuple[Committed, Sequence[Position]]]) -> str:
    """What the kit sees of a service that may have read none of its input, per consumer group of it
    in `watched` (with where the kit sent that group's input, on one topic): the group committed
    nothing on those partitions and has no member that finished joining it. A consumer with
    librdkafka's default group timing joins in up to half its session.timeout.ms (45 s) on some
    brokers, longer than a short `--timeout`. "" when every group committed or is stable; else
    "; "-led clauses, one per such group, and the advice when one is still joining."""
    clauses: list[str] = []
    joining = False
    for commits, sent in watched:
        tps = sorted({position[:2] for position in sent})
        committed = commits.read(tps)
        if committed is None:
            clauses.append(f"the broker did not answer for {commits.group}'s committed offsets")
            continue
        if max(committed.values()) >= 0:
            continue
        state = group_state(target.kafka, commits.group, target.metadata_timeout_s)
        if state is ConsumerGroupState.STABLE:
            continue
        topic = tps[0][0]
        nothing = f"{commits.group} committed nothing on {topic}"
        if state is None:
            clauses.append(f"{nothing} (the broker did not describe the group)")
        elif state in (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD):
            clauses.append(
                f"{nothing} and has no member: the {target.service} does not read {topic} in it (contract §2)"
            )
        else:
            joining = True
            clauses.append(
                f"{nothing} and no member has finished joining it (state {state.name}), so the "
                f"{target.service} has read nothing on {topic} yet"
            )
    if joining:
        clauses.append(
            "a first group join with librdkafka's default timing takes up to half the consumer's "
            "session.timeout.ms (about 23 s of 45) on some brokers; raise --timeout, or shorten the "
            f"{target.service}'s session.timeout.ms"
        )
    return "".join(f"; {clause}" for clause in clauses)


class Sender:
    """The kit's producer: every message acknowledged, its position remembered."""

    def __init__(self, config: Mapping[str, str], metadata_timeout_s: float) -> None:
        self._publisher = KafkaPublisher(dict(config))
        self._metadata_timeout_s = metadata_timeout_s

    def send(
        self,
        topic: str,
        key: bytes,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> Position:
        if partition is not None:
            self._publisher.send(topic, key, value, headers, partition=partition)
            if self._publisher.flush(30.0):
                raise RuntimeError(f"the broker did not acknowledge a message to {topic}")
            return (topic, partition, -1)
        got_partition, offset = self._publisher.send_sync(topic, key, value, headers, timeout_s=30.0)
        return (topic, got_partition, offset)

    def partitions(self, topic: str) -> int:
        return self._publisher.partitions(topic, timeout_s=self._metadata_timeout_s)


def decoded(records: Sequence[Record], cls: type[M]) -> list[tuple[Record, M | None]]:
    """Each record with its message, or None when it does not decode as `cls`."""
    out: list[tuple[Record, M | None]] = []
    for record in records:
        try:
            out.append((record, decode(cls, record.value, MAX_BYTES)))
        except InvalidMessageError:
            out.append((record, None))
    return out


def header_problem(record: Record, msg_type: str, node: str) -> str | None:
    """What is wrong with a record's routing headers (contract section 3.1), or None."""
    if record.unreadable:  # its headers were not kept: name why, not the headers that look missing
        return f"{_where(record)}: {record.unreadable}"
    expected = {H_TYPE: msg_type, H_NODE: node, H_SCHEMA: str(SCHEMA_VERSION)}
    for name, value in expected.items():
        got = header_str(record.headers, name)
        if got != value:
            return f"{_where(record)}: header {name}={got!r}, expected {value!r}"
    return None


def _where(record: Record) -> str:
    return f"{topic_label(record.topic)}/{record.partition}/{record.offset}"


def lease_holder(tail: Tail, topics: TopicNames, role: str) -> tuple[Holder | None, list[str]]:
    """The current holder of a role's lease as the leases topic says (contract section 6), folded as
    the services' lease readers fold it, and what is wrong with the role's records: their routing
    headers, and the bounds a reader refuses a record for (`sapo.node.lease.lease_problem`; a record
    renewed ahead of this clock still counts for its epoch, never as live)."""
    holder: Holder | None = None
    problems: list[str] = []
    now_s = time.time()
    for record, lease in decoded(tail.on(topics.leases), lease_pb2.Lease):
        if lease is None or lease.role != role or lease.node_id != topics.node_id:
            continue
        if (routing := header_problem(record, "Lease", topics.node_id)) is not None:
            problems.append(routing)
            if record.unreadable:  # a reader refuses it whole (`bad_header`)
                continue
        refused = lease_problem(lease, record.offset, now_s)
        if refused is not None:
            problems.append(f"{_where(record)}: {refused}")
            if refused.reason != RENEWED_AHEAD:
                continue
        holder = fold(holder, lease, record.offset, clock_trusted=refused is None)
    return holder, problems


def check_lease(
    results: Results, tail: Tail, topics: TopicNames, role: str, epochs: Mapping[str, int]
) -> None:
    """The role's lease records are valid, the lease is held, and every write named in `epochs`
    carries its epoch."""
    holder, problems = lease_holder(tail, topics, role)
    results.add(
        f"writes valid {role} lease records",
        "§6",
        not problems,
        "; ".join(problems) or "routing headers and ttl, epoch and renewal time within a reader's bounds",
    )
    if holder is None:
        results.add(f"holds the {role} lease", "§6", False, f"no {role} lease record on {topics.leases}")
        return
    results.add(
        f"holds the {role} lease",
        "§6",
        True,
        f"epoch {holder.epoch} held by {holder.owner} on {topics.leases}",
    )
    wrong = {what: epoch for what, epoch in epochs.items() if epoch != holder.epoch}
    detail = ", ".join(f"{what} carries epoch {epoch}" for what, epoch in wrong.items())
    results.add(
        "writes carry the lease epoch",
        "§6",
        not wrong,
        f"{detail}; the lease's epoch is {holder.epoch}"
        if wrong
        else f"{', '.join(epochs)}: epoch {holder.epoch}",
    )


@dataclass(frozen=True)
class Rejected:
    """A message the service must dead-letter: where it was sent, and the reason it must give."""

    position: Position
    key: bytes
    value: bytes
    reason: str
    what: str


def check_dead_letters(
    results: Results, tail: Tail, topics: TopicNames, expected: Sequence[Rejected], timeout_s: float
) -> None:
    """Every message in `expected` is dead-lettered with its original key and bytes and the reason
    headers (contract section 10)."""

    def match(rejected: Rejected) -> Record | None:
        source = "/".join(str(p) for p in rejected.position)
        for record in tail.on(topics.dlq):
            if header_str(record.headers, H_SOURCE) == source:
                return record
        return None

    tail.wait(lambda: all(match(r) is not None for r in expected) or None, timeout_s)
    problems: list[str] = []
    for rejected in expected:
        record = match(rejected)
        if record is None:
            problems.append(
                f"no dead letter for the {rejected.what} ({'/'.join(map(str, rejected.position))})"
            )
            continue
        reason = header_str(record.headers, H_REASON)
        if reason != rejected.reason:
            problems.append(f"the {rejected.what} was dead-lettered as {reason!r}, not {rejected.reason!r}")
        if record.key != rejected.key or (record.value or b"") != rejected.value:
            problems.append(f"the dead letter of the {rejected.what} lost its original key or bytes")
        missing = [h for h in (H_DETAIL, H_SERVICE) if h not in record.headers]
        if missing:
            problems.append(f"the dead letter of the {rejected.what} lacks headers {missing}")
    reasons = ", ".join(sorted({r.reason for r in expected}))
    results.add(
        "dead-letters malformed input",
        "§10",
        not problems,
        "; ".join(problems)
        if problems
        else f"{len(expected)} dead letters on {topics.dlq} ({reasons}), bytes intact",
    )
