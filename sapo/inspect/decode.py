"""One consumed record -> one `Entry`: what it is, whose, which task, round and policy version.

The message type comes from the record's `sapo-type` header when it names a message of the wire
contract (`sapo.v1`), else from the topic's role (the last part of its name: `rollouts`, `batches`,
`policy`, `work`, `leases`, `keys`). A dead letter keeps the original key, bytes and headers, so it is decoded
the same way, with the role of the topic it was read from (`sapo-dlq-source`) as the fallback, and its
rejection reason read from the `sapo-dlq-*` headers. Nothing here raises on bad input: a payload that
does not decode becomes an entry with its size, headers and the reason (`error`), and so does a record
whose headers could not be read (a header name that is not UTF-8: `bad_header`, as the services'
consumer loops refuse it).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf import descriptor_pool, json_format, message_factory, text_format
from google.protobuf.message import DecodeError, Message

import sapo.v1
from sapo.kafka import Record
from sapo.kafka.dlq import H_DETAIL, H_REASON, H_SERVICE, H_SOURCE
from sapo.v1 import batch_pb2, identity_pb2, policy_pb2, rollout_pb2
from sapo.wire import H_NODE, H_TASK, H_TYPE, InvalidMessageError, decode

#: What each topic role carries when a record has no type header (`sapo.topics.TopicNames`).
ROLE_TYPES: Final[Mapping[str, str]] = {
    "rollouts": "RolloutGroup",
    "batches": "TrainingBatch",
    "policy": "PolicyUpdate",
    "work": "WorkItem",
    "leases": "Lease",
    "keys": "KeyAnnouncement",
}
DLQ_ROLE: Final = "dlq"
UNKNOWN: Final = "?"
_TYPE_NAME_RE: Final = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
#: Field names that mean "policy version" in the contract's messages, in order of preference.
_VERSION_FIELDS: Final = ("policy_version", "version", "target_policy_version", "min_policy_version")
_SUMMARY_CHARS: Final = 96


@dataclass(frozen=True)
class Entry:
    """A record as `sapo inspect` shows it. `round` and `policy_version` are None when the message
    has no such field (or did not decode); `error` is the reason it did not decode, else empty."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str
    size: int
    type: str
    node: str = ""
    tasks: tuple[str, ...] = ()
    round: int | None = None
    policy_version: int | None = None
    summary: str = ""
    error: str = ""
    dlq_reason: str = ""
    dlq_detail: str = ""
    dlq_service: str = ""
    dlq_source: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    payload: Mapping[str, Any] | None = None


def topic_role(topic: str) -> str:
    """`sapo.node.n0.batches` -> `batches`; the swarm topic `sapo.swarm.rollouts` -> `rollouts`."""
    return topic.rsplit(".", 1)[-1]


def _load_contract() -> None:
    """Import every generated module of the wire contract so the descriptor pool knows its messages
    (a message type added to `proto/sapo/v1` is decoded without a change here)."""
    for module in pkgutil.iter_modules(sapo.v1.__path__):
        if module.name.endswith("_pb2"):
            importlib.import_module(f"sapo.v1.{module.name}")


_load_contract()


def message_class(type_name: str) -> type[Message] | None:
    """The generated class of `sapo.v1.<type_name>`, or None when the contract has no such message."""
    if not _TYPE_NAME_RE.fullmatch(type_name):
        return None
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(f"sapo.v1.{type_name}")
    except KeyError:
        return None
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


def printable_headers(headers: Mapping[str, bytes]) -> dict[str, str]:
    """Header values as text; binary ones as `<N bytes>` so a terminal never gets raw bytes."""
    shown: dict[str, str] = {}
    for name, value in headers.items():
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        shown[name] = text if text.isprintable() and (text or not value) else f"<{len(value)} bytes>"
    return shown


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw is not None else ""


def type_of(record: Record) -> str:
    """The record's message type name: its type header, else its topic's role (for a dead letter, the
    role of the topic it was rejected from); UNKNOWN when neither says."""
    declared = _text(record.headers.get(H_TYPE))
    if declared:
        return declared
    role = topic_role(record.topic)
    if role == DLQ_ROLE:
        source = _text(record.headers.get(H_SOURCE))
        role = topic_role(source.split("/", 1)[0]) if source else ""
    return ROLE_TYPES.get(role, UNKNOWN)


def to_entry(record: Record, max_bytes: int, with_payload: bool = False) -> Entry:
    """Decode `record` into an Entry; never raises for bad bytes or unknown types."""
    headers = record.headers
    type_name = type_of(record)
    base: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": _text(record.key),
        "size": len(record.value or b""),
        "type": type_name,
        "node": _text(headers.get(H_NODE)),
        "tasks": (_text(headers[H_TASK]),) if H_TASK in headers else (),
        "dlq_reason": _text(headers.get(H_REASON)),
        "dlq_detail": _text(headers.get(H_DETAIL)),
        "dlq_service": _text(headers.get(H_SERVICE)),
        "dlq_source": _text(headers.get(H_SOURCE)),
        "headers": printable_headers(headers),
    }
    if record.unreadable:  # what the services' consumer loops refuse, headers and all
        return Entry(**base, error=f"bad_header: {record.unreadable}")
    cls = message_class(type_name)
    if cls is None:
        said = f"type header {type_name!r}" if H_TYPE in headers else f"topic {record.topic!r}"
        return Entry(**base, error=f"unknown_type: the contract has no message for {said}")
    try:
        message = decode(cls, record.value, max_bytes)
    except InvalidMessageError as exc:
        return Entry(**base, error=str(exc))
    base.update(_facts(message))
    if with_payload:
        base["payload"] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return Entry(**base)


def _facts(message: Message) -> dict[str, Any]:
    """node, tasks, round, policy version and a one-line summary, from whichever fields the message has."""
    fields = message.DESCRIPTOR.fields_by_name
    facts: dict[str, Any] = {}
    node: str = getattr(message, "node_id") if "node_id" in fields else ""  # noqa: B009 (any message type)
    if node:
        facts["node"] = node
    if "round" in fields:
        facts["round"] = int(message.round)  # type: ignore[attr-defined]
    version = next((name for name in _VERSION_FIELDS if name in fields), None)
    if version is not None:
        facts["policy_version"] = int(getattr(message, version))
    describe = _DESCRIBERS.get(message.DESCRIPTOR.name, _describe_fields)
    facts.update(describe(message))
    return facts


def _shorten(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _describe_rollout(message: Message) -> dict[str, Any]:
    group: rollout_pb2.RolloutGroup = message  # type: ignore[assignment]
    rewards = [c.reward for c in group.completions if c.HasField("reward")]
    question = _shorten(" ".join(group.question.text.split()), 60)
    summary = (
        f"{len(group.completions)} completions, reward {_mean(rewards):.2f}, {group.model_id}: {question}"
    )
    return {"tasks": (group.question.task,), "summary": summary}


def _describe_batch(message: Message) -> dict[str, Any]:
    batch: batch_pb2.TrainingBatch = message  # type: ignore[assignment]
    local = sum(1 for g in batch.groups if g.source == batch_pb2.GROUP_SOURCE_LOCAL)
    peers = sorted({g.group.node_id for g in batch.groups if g.source == batch_pb2.GROUP_SOURCE_EXTERNAL})
    rewards = [r for g in batch.groups for r in g.rewards]
    summary = (
        f"seq {batch.sequence}: {len(batch.groups)} groups ({local} local, "
        f"{len(batch.groups) - local} external{' from ' + ','.join(peers) if peers else ''}), "
        f"reward {_mean(rewards):.2f}"
    )
    tasks = tuple(sorted({g.group.question.task for g in batch.groups}))
    return {"tasks": tasks, "summary": summary}


def _describe_policy(message: Message) -> dict[str, Any]:
    update: policy_pb2.PolicyUpdate = message  # type: ignore[assignment]
    summary = f"v{update.version} {update.manifest_uri}"
    if update.HasField("metrics"):
        m = update.metrics
        summary = f"v{update.version} from {update.batch_id}: reward {m.reward_mean:.2f}, loss {m.loss:.4f}"
    return {"summary": summary}


def _describe_keys(message: Message) -> dict[str, Any]:
    announcement: identity_pb2.KeyAnnouncement = message  # type: ignore[assignment]
    statement = identity_pb2.KeyStatement()
    try:
        statement.ParseFromString(announcement.statement)
    except DecodeError:  # shown, never fatal: receivers refuse such an announcement themselves
        return {"summary": f"undecodable statement, {len(announcement.signatures)} signature(s)"}
    action = identity_pb2.KeyAction.Name(statement.action).removeprefix("KEY_ACTION_").lower()
    summary = f"{action} key {statement.key_id}, {len(announcement.signatures)} signature(s)"
    return {"node": statement.node_id, "summary": summary}


def _describe_fields(message: Message) -> dict[str, Any]:
    """Any other message (one added to the contract later): its fields on one line, shortened."""
    return {"summary": _shorten(text_format.MessageToString(message, as_one_line=True), _SUMMARY_CHARS)}


_DESCRIBERS: Final[Mapping[str, Callable[[Message], dict[str, Any]]]] = {
    "RolloutGroup": _describe_rollout,
    "TrainingBatch": _describe_batch,
    "PolicyUpdate": _describe_policy,
    "KeyAnnouncement": _describe_keys,
}
