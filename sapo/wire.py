"""The wire contract at the edge: header names, bounded decoding and structural validation.

Filters that only need routing facts (producing node, task, schema version) read headers, so a
sampler can drop most of the swarm's traffic without parsing protobuf. Decoding is bounded by size
and every failure becomes an `InvalidMessageError` with a short, metric-safe reason.

A rollout group also carries `sapo-group-facts` (`GroupFacts`): what a lazily verifying sampler
screens and pools a swarm group on, so that it decodes only the groups its selection picks. The
header is optional (older senders do not write it, older receivers ignore it) and unsigned: whoever
decodes the body checks that it says the same (`facts_mismatch`), which is where a lie is caught.

A node's generator writes `sapo-generator-config` on each group too: the fingerprint of the settings
that decide what it publishes for a work item (`sapo.generator.fingerprint`), which the node's sampler
compares across the replicas (`sapo.sampler.configs`). Optional and unsigned like the facts: it is a
diagnosis, nothing is accepted or refused on it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, NamedTuple, Protocol, TypeVar

from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp

from sapo.topics import NODE_ID_RE
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2, work_pb2

SCHEMA_VERSION = 1

H_NODE = "sapo-node-id"
H_TASK = "sapo-task"
H_SCHEMA = "sapo-schema-version"
H_TYPE = "sapo-type"
H_FACTS = "sapo-group-facts"
FACTS_VERSION = "f1"
"""The first field of a `sapo-group-facts` value; a receiver ignores a header of another version."""
_FACTS_PREFIX: Final = FACTS_VERSION.encode() + b";"
H_GENERATOR_CONFIG = "sapo-generator-config"
GENERATOR_CONFIG_CHARS: Final = 16
"""Lower-case hex digits of a `sapo-generator-config` value (64 bits of a SHA-256)."""
_GENERATOR_CONFIG_RE: Final = re.compile(rb"[0-9a-f]{%d}" % GENERATOR_CONFIG_CHARS)
GROUP_ID_RE: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A group id: a UUID as `str(uuid.UUID)` spells it, its one spelling. `uuid.UUID` also reads upper
case, braces, any number of hyphens and `urn:uuid:` prefixes: copies of one group under other
spellings would pass the dedupe by id into one batch, and an id could be hundreds of kilobytes."""

Headers = Mapping[str, bytes]
M = TypeVar("M", bound=Message)


MAX_DETAIL_CHARS: Final = 400
"""Longest `InvalidMessageError.detail`: details quote what a sender wrote (ids, header values), which
may be huge, and go into log lines and dead-letter headers."""
MAX_GROUP_COMPLETIONS: Final = 256
"""Completions a group may have (a generator's largest L): each is re-scored by a receiving sampler and
becomes a row of its trainer's step, so a peer's group of thousands of tiny completions cost seconds
of verification and gigabytes of training memory."""
MAX_BATCH_GROUPS: Final = 512
"""Groups a training batch may have (a sampler's largest I + J)."""


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text`, cut to `limit` characters with a note of how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class InvalidMessageError(ValueError):
    """A payload that cannot be used; `reason` is a bounded label for metrics and the DLQ, `detail` is
    clipped to `MAX_DETAIL_CHARS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        detail = clip(detail)
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class HeaderSigner(Protocol):
    """Adds identity headers to a message's routing headers (`sapo.identity.Signer`)."""

    def sign_headers(self, headers: Sequence[tuple[str, bytes]], value: bytes) -> list[tuple[str, bytes]]: ...


def message_headers(
    msg_type: str, node_id: str, value: bytes, task: str = "", signer: HeaderSigner | None = None
) -> list[tuple[str, bytes]]:
    """Routing headers; signed by `signer` (the node's key) when given."""
    headers = [
        (H_TYPE, msg_type.encode()),
        (H_NODE, node_id.encode()),
        (H_SCHEMA, str(SCHEMA_VERSION).encode()),
    ]
    if task:
        headers.append((H_TASK, task.encode()))
    return signer.sign_headers(headers, value) if signer is not None else headers


def rollout_headers(
    group: rollout_pb2.RolloutGroup,
    value: bytes,
    signer: HeaderSigner | None = None,
    generator_config: str = "",
) -> list[tuple[str, bytes]]:
    """Routing headers plus the group's facts, signed by `signer` when given (a lazy sampler pools the
    group on its facts before it decodes the body, so nobody but the signer may restate them), and,
    when given, the fingerprint of the generator settings it was sampled with (outside the signature:
    only the node's own sampler reads it, as a diagnosis)."""
    headers = message_headers("RolloutGroup", group.node_id, value, group.question.task)
    headers.append((H_FACTS, encode_facts(group_facts(group))))
    if signer is not None:
        headers = signer.sign_headers(headers, value)
    if generator_config:
        headers.append((H_GENERATOR_CONFIG, generator_config.encode()))
    return headers


def read_generator_config(headers: Headers) -> str | None:
    """The `sapo-generator-config` fingerprint of a record; None when absent (an older generator) or
    not of the form `GENERATOR_CONFIG_CHARS` lower-case hex digits (another version's)."""
    raw = headers.get(H_GENERATOR_CONFIG)
    if raw is None or not _GENERATOR_CONFIG_RE.fullmatch(raw):
        return None
    return raw.decode("ascii")


class GroupFacts(NamedTuple):
    """What a sampler screens and pools a swarm group on before decoding it: the `sapo-group-facts`
    header, `f1;<group_id>;<round>;<completed_at seconds>;<nanos>;<config_digest>;<split>;<scored>;<signal>`.

    Integers in decimal; `split` is the `Split` enum number of the question's provenance; `scored`
    counts the completions whose finish reason is not ERROR; `signal` is 1 when the sender's rewards
    of those completions are all finite and not all equal, else 0. Each field restates the body, so
    `group_facts` of the decoded body equals the header's facts exactly, or the message lies.
    A named tuple, not a frozen dataclass: a lazy sampler builds one per record it reads, at a
    quarter of the cost.
    """

    group_id: str
    round: int
    completed_seconds: int
    completed_nanos: int
    config_digest: str
    split: int
    scored: int
    signal: bool

    @property
    def completed_s(self) -> float:
        """completed_at as epoch seconds; 0.0 when unset."""
        return self.completed_seconds + self.completed_nanos / 1e9


def group_facts(group: rollout_pb2.RolloutGroup) -> GroupFacts:
    """The facts `group`'s body states (what its header must say)."""
    error = rollout_pb2.FINISH_REASON_ERROR
    claimed = [c.reward for c in group.completions if c.finish_reason != error]
    # Rewards are 32-bit on the wire: their double sum is finite exactly when every one is.
    signal = math.isfinite(sum(claimed)) and len(set(claimed)) > 1
    done = group.completed_at
    return GroupFacts(
        group_id=group.group_id,
        round=group.round,
        completed_seconds=done.seconds,
        completed_nanos=done.nanos,
        config_digest=group.question.provenance.config_digest,
        split=group.question.provenance.split,
        scored=len(claimed),
        signal=signal,
    )


def encode_facts(facts: GroupFacts) -> bytes:
    fields = (
        FACTS_VERSION,
        facts.group_id,
        facts.round,
        facts.completed_seconds,
        facts.completed_nanos,
        facts.config_digest,
        facts.split,
        facts.scored,
        int(facts.signal),
    )
    return ";".join(str(f) for f in fields).encode()


def read_facts(headers: Headers) -> GroupFacts | None:
    """The facts header of a record: None when absent or of another version (the receiver decodes
    the body instead). Raises InvalidMessageError("facts_mismatch") when it is malformed."""
    raw = headers.get(H_FACTS)
    if raw is None or not raw.startswith(_FACTS_PREFIX):
        return None
    try:
        _, group_id, round_, seconds, nanos, digest, split, scored, signal = raw.split(b";")
        # tuple.__new__ skips the named tuple's Python-level __new__ (0.7 -> 0.15 us): one per record.
        facts = tuple.__new__(
            GroupFacts,
            (
                group_id.decode("ascii"),
                int(round_),
                int(seconds),
                int(nanos),
                digest.decode("ascii"),
                int(split),
                int(scored),
                signal == b"1",
            ),
        )
    except ValueError:  # a wrong field count, a non-integer or a non-ASCII text (UnicodeDecodeError)
        facts = None
    if facts is None or signal not in (b"0", b"1") or not _in_range(facts):
        raise InvalidMessageError("facts_mismatch", f"malformed {H_FACTS} header {raw[:200]!r}")
    return facts


def _in_range(facts: GroupFacts) -> bool:
    """Every value is one a valid body can hold (a group id as `GROUP_ID_RE` spells it, a uint64
    round, a protobuf Timestamp, ...): a receiver builds with them, and remembers the id for its
    dedupe, before it has seen the body."""
    return (
        GROUP_ID_RE.fullmatch(facts.group_id) is not None
        and 0 <= facts.round < 2**64
        and -(2**63) <= facts.completed_seconds < 2**63
        and 0 <= facts.completed_nanos < 10**9
        and -(2**31) <= facts.split < 2**31
        and facts.scored >= 0
    )


def facts_problem(group: rollout_pb2.RolloutGroup, headers: Headers) -> str | None:
    """ "facts_mismatch" when the record's facts header says other than its body; None when it agrees,
    is absent or of another version. Raises InvalidMessageError when the header is malformed."""
    facts = read_facts(headers)
    return "facts_mismatch" if facts is not None and facts != group_facts(group) else None


def header_str(headers: Headers, name: str) -> str:
    raw = headers.get(name)
    return raw.decode("utf-8", "replace") if raw is not None else ""


DECODE_REASONS: Final = ("empty_payload", "oversized", "undecodable", "schema_version")
"""Every reason `decode` refuses a payload for."""


def decode(cls: type[M], value: bytes | None, max_bytes: int) -> M:
    """Parse a payload of a known type; size is checked first so a huge value is never parsed."""
    if not value:  # null (a tombstone) or zero bytes: no message of ours encodes to nothing
        raise InvalidMessageError("empty_payload")
    if len(value) > max_bytes:
        raise InvalidMessageError("oversized", f"{len(value)} bytes > {max_bytes}")
    msg = cls()
    try:
        msg.ParseFromString(value)
    except DecodeError as exc:
        raise InvalidMessageError("undecodable", str(exc)) from None
    schema = getattr(msg, "schema_version", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        # Every message of ours sets it: none at all is most likely another message type in the topic.
        missing = f"no schema_version: not a {cls.__name__} (another message type?)"
        raise InvalidMessageError("schema_version", f"{schema} != {SCHEMA_VERSION}" if schema else missing)
    return msg


GROUP_REASONS: Final = (
    "bad_group_id",
    "missing_node_id",
    "bad_node_id",
    "missing_question",
    "no_completions",
    "too_many_completions",
    "missing_finish_reason",
    "logprob_length_mismatch",
    "nonfinite_logprob",
)
"""Every reason `validate_rollout_group` returns."""


def validate_rollout_group(group: rollout_pb2.RolloutGroup) -> str | None:
    """Structural checks every consumer of a group relies on; None when valid, else a reason."""
    if not GROUP_ID_RE.fullmatch(group.group_id):
        return "bad_group_id"
    if not group.node_id:
        return "missing_node_id"
    if not NODE_ID_RE.fullmatch(group.node_id):  # ids go into metric labels, logs and batches
        return "bad_node_id"
    question = group.question
    if not (question.task and question.text and question.provenance.dataset):
        return "missing_question"
    if not group.completions:
        return "no_completions"
    if len(group.completions) > MAX_GROUP_COMPLETIONS:
        return "too_many_completions"
    return _validate_completions(group)


def _validate_completions(group: rollout_pb2.RolloutGroup) -> str | None:
    """Per completion, in order. This runs on every group a sampler reads, so the logprobs are
    copied out in one C call (a slice: iterating the protobuf container costs ~1.5x more) and checked
    with one C sum: `logprobs` is `repeated float` (32-bit), whose finite values cannot overflow a
    double sum, so the sum is finite exactly when every entry is (a NaN or an infinity anywhere makes
    it NaN or infinite)."""
    unspecified = rollout_pb2.FINISH_REASON_UNSPECIFIED
    for comp in group.completions:
        if comp.finish_reason == unspecified:
            return "missing_finish_reason"
        logprobs = comp.logprobs[:]
        if logprobs:
            if len(logprobs) != len(comp.token_ids):
                return "logprob_length_mismatch"
            if not math.isfinite(sum(logprobs)):
                return "nonfinite_logprob"
    return None


BATCH_REASONS: Final = (
    "missing_batch_id",
    "too_many_groups",
    "missing_source",
    "too_many_completions",
    "reward_length_mismatch",
    "nonfinite_advantage",
)
"""Every reason `validate_batch` returns."""


def validate_batch(batch: batch_pb2.TrainingBatch) -> str | None:
    """Structural checks the trainer relies on; None when valid, else a reason.

    A batch with no groups is valid: a lock-step sampler emits one when no group of a round had
    signal, and the trainer treats it as a no-op step that still advances the policy version, so the
    node's rounds stay aligned with the swarm's. It still needs its batch id (the idempotency key).
    """
    if not batch.batch_id:
        return "missing_batch_id"
    if len(batch.groups) > MAX_BATCH_GROUPS:
        return "too_many_groups"
    for bg in batch.groups:
        if bg.source == batch_pb2.GROUP_SOURCE_UNSPECIFIED:
            return "missing_source"
        n = len(bg.group.completions)
        if n > MAX_GROUP_COMPLETIONS:
            return "too_many_completions"
        if len(bg.rewards) != n or len(bg.advantages) != n:
            return "reward_length_mismatch"
        if any(not math.isfinite(x) for x in (*bg.rewards, *bg.advantages)):
            return "nonfinite_advantage"
    return None


POLICY_UPDATE_REASONS: Final = ("incomplete_policy_update",)
"""Every reason `validate_policy_update` returns."""


def validate_policy_update(update: policy_pb2.PolicyUpdate) -> str | None:
    if not update.node_id or not update.manifest_uri or len(update.manifest_sha256) != 64:
        return "incomplete_policy_update"
    return None


WORK_ITEM_REASONS: Final = ("missing_node_id", "empty_version_range")
"""Every reason `validate_work_item` returns."""


def validate_work_item(item: work_pb2.WorkItem) -> str | None:
    if not item.node_id:
        return "missing_node_id"
    if item.HasField("max_policy_version") and item.max_policy_version < item.min_policy_version:
        return "empty_version_range"
    return None


def now_timestamp() -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.now(UTC))
    return ts
