"""Fuzzing of every consumer's decode and validation path (hypothesis): random bytes, mutated valid
messages, oversized payloads, wrong schema versions, lying headers. The property everywhere: a
message is either accepted or refused with a reason (`InvalidMessageError` or a reason string), never
an exception of another kind, and a consumer loop fed only garbage finishes (counts, dead-letters,
commits) every record.

`SAPO_FUZZ_EXAMPLES` raises the number of cases per property (default 200: a few seconds); e.g.
`SAPO_FUZZ_EXAMPLES=20000 pytest tests/unit/test_fuzz.py` for a longer run.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sapo import wire
from sapo.identity import Sender
from sapo.kafka import ConsumerLoop, DeadLetters, Disposition, Record, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag
from sapo.sampler import REASONS, History, Screen, SeenGroups, Unread, VerifyMode, arrival_facts, parse
from sapo.sampler.settings import SamplerSettings
from sapo.v1 import batch_pb2, identity_pb2, lease_pb2, policy_pb2, rollout_pb2, work_pb2
from sapo.wire import InvalidMessageError
from tests.factories import make_group
from tests.unit.sampler.builders import questions, real_group

EXAMPLES = int(os.environ.get("SAPO_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_BYTES = 1 << 20
NODE = "node-0"
RECORDS = questions(node_seed=23, count=4)

VALIDATORS: dict[type[Message], Callable[[Any], str | None]] = {
    rollout_pb2.RolloutGroup: wire.validate_rollout_group,
    batch_pb2.TrainingBatch: wire.validate_batch,
    policy_pb2.PolicyUpdate: wire.validate_policy_update,
    work_pb2.WorkItem: wire.validate_work_item,
    lease_pb2.Lease: lambda _: None,
    identity_pb2.KeyAnnouncement: lambda _: None,
}


def _valid_examples() -> list[bytes]:
    group = real_group(RECORDS[0], "peer-1")
    batch = batch_pb2.TrainingBatch(
        schema_version=wire.SCHEMA_VERSION,
        batch_id=f"{NODE}/3",
        node_id=NODE,
        sequence=3,
        groups=[batch_pb2.BatchGroup(group=group, rewards=[1.0, 0.0, 0.0, 1.0], advantages=[1, -1, -1, 1])],
    )
    update = policy_pb2.PolicyUpdate(
        schema_version=wire.SCHEMA_VERSION, node_id=NODE, version=4, manifest_uri="file:///x/manifest.json"
    )
    work = work_pb2.WorkItem(schema_version=wire.SCHEMA_VERSION, node_id=NODE, round=2, position=1)
    return [m.SerializeToString() for m in (group, make_group(), batch, update, work)]


VALID = _valid_examples()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message with bytes flipped, inserted, deleted, or cut short."""
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(("flip", "insert", "delete", "truncate")))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and data:
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[at:]
    return bytes(data)


PAYLOADS = st.one_of(st.binary(max_size=4096), mutated())


def decode_and_validate(cls: type[Message], value: bytes) -> str | None:
    """What every consumer does first: the reason a payload is refused, or None."""
    try:
        msg = wire.decode(cls, value, MAX_BYTES)
    except InvalidMessageError as exc:
        return exc.reason
    return VALIDATORS[cls](msg)


@FUZZ
@given(cls=st.sampled_from(sorted(VALIDATORS, key=lambda c: c.__name__)), value=PAYLOADS)
def test_every_message_type_decodes_or_refuses_by_reason(cls: type[Message], value: bytes) -> None:
    reason = decode_and_validate(cls, value)
    assert reason is None or (isinstance(reason, str) and reason)


@FUZZ
@given(schema=st.integers(0, 2**32 - 1).filter(lambda v: v != wire.SCHEMA_VERSION))
def test_a_foreign_schema_version_is_refused_as_such(schema: int) -> None:
    group = make_group()
    group.schema_version = schema
    assert decode_and_validate(rollout_pb2.RolloutGroup, group.SerializeToString()) == "schema_version"


def test_an_oversized_payload_is_refused_before_it_is_parsed() -> None:
    assert decode_and_validate(rollout_pb2.RolloutGroup, b"\xff" * (MAX_BYTES + 1)) == "oversized"


def _core() -> Any:
    settings_ = SamplerSettings(
        node_id=NODE, local_groups=2, external_groups=1, questions_per_round=2, expected_peers=1
    )
    return settings_.core(History())


@FUZZ
@given(value=mutated(), claimed=st.sampled_from(("peer-1", "peer-2", NODE, "")))
def test_the_sampler_core_refuses_or_pools_any_decodable_group(value: bytes, claimed: str) -> None:
    """Past decoding, screening (identity, freshness, re-derivation, re-scoring, pool) of a mutated
    group returns a reason or pools it; a group that names another node than its verified sender,
    or that cannot be re-derived, raises InvalidMessageError (the caller dead-letters it)."""
    try:
        group = wire.decode(rollout_pb2.RolloutGroup, value, MAX_BYTES)
    except InvalidMessageError:
        return
    if wire.validate_rollout_group(group) is not None:
        return
    core = _core()
    for origin in ("external", "local"):
        try:
            verdict = core.admit(group, origin, "h", time.time(), Sender(claimed or group.node_id))
        except InvalidMessageError as exc:
            assert exc.reason
            continue
        assert verdict is None or isinstance(verdict, str)


HEADERS = st.lists(
    st.tuples(
        st.sampled_from(("sapo-node", "sapo-kind", "sapo-schema", "sapo-task", "sapo-chunk", "x")),
        st.binary(max_size=24),
    ),
    max_size=6,
)


@FUZZ
@given(messages=st.lists(st.tuples(PAYLOADS, HEADERS), min_size=1, max_size=20))
def test_a_consumer_loop_fed_garbage_finishes_every_record(messages: list[tuple[bytes, list[Any]]]) -> None:
    """The one consumer loop with the services' first step as its handler: every record is either
    handled or dead-lettered with a reason, and the group's committed offset passes the last one."""
    bus = MemoryBus()
    publisher = MemoryPublisher(bus)
    for value, headers in messages:
        bus.append("in", b"k", value, headers)
    registry = CollectorRegistry()
    metrics = TransportMetrics(registry, "fuzz")
    handled: list[str | None] = []

    def handle(record: Record) -> Disposition:
        reason = decode_and_validate(rollout_pb2.RolloutGroup, record.value or b"")
        if reason is not None:
            raise InvalidMessageError(reason)
        handled.append(reason)
        return Disposition.DONE

    loop = ConsumerLoop(
        MemoryConsumerClient(bus, "g"),
        ["in"],
        handle,
        stop=StopFlag(),
        metrics=metrics,
        dead_letters=DeadLetters(publisher, "dlq", "fuzz", metrics),
        poll_timeout_s=0.0,
    )
    loop.run(idle_timeout_s=0.0)
    assert bus.committed[("g", ("in", 0))] == len(messages)
    assert len(handled) + len(bus.topics.get("dlq", [])) <= len(messages)
    for dead in bus.topics.get("dlq", []):
        assert dead.headers["sapo-dlq-reason"]


FACT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "group_id": st.text(max_size=40),
    "round": st.integers(-(2**40), 2**40),
    "completed_seconds": st.integers(-(2**40), 2**40),
    "completed_nanos": st.integers(-(2**31), 2**31),
    "config_digest": st.text(alphabet="0123456789abcdef", max_size=64),
    "split": st.integers(-3, 3),
    "scored": st.integers(-3, 12),
    "signal": st.booleans(),
}


@st.composite
def facts_headers(draw: st.DrawFn, group: rollout_pb2.RolloutGroup) -> dict[str, bytes]:
    """The routing headers of `group` with a facts header that is honest, lies about some fields,
    is garbage, is of another version, or is missing."""
    headers = dict(wire.message_headers("RolloutGroup", group.node_id, b"", group.question.task))
    kind = draw(st.sampled_from(("honest", "lying", "garbage", "other_version", "missing")))
    if kind == "missing":
        return headers
    if kind == "garbage":
        return headers | {wire.H_FACTS: b"f1;" + draw(st.binary(max_size=120))}
    if kind == "other_version":
        return headers | {wire.H_FACTS: b"f2;" + draw(st.binary(max_size=40))}
    facts = wire.group_facts(group)
    if kind == "lying":
        for name in draw(st.lists(st.sampled_from(sorted(FACT_FIELDS)), min_size=1, max_size=3, unique=True)):
            honest = getattr(facts, name)
            lie = draw(FACT_FIELDS[name].filter(functools.partial(operator.ne, honest)))
            facts = facts._replace(**{name: lie})
    return headers | {wire.H_FACTS: wire.encode_facts(facts)}


def _lazy_core() -> Any:
    settings_ = SamplerSettings(
        node_id=NODE, verify="lazy", round_mode="async", local_groups=0, external_groups=1, max_per_source=1
    )
    return settings_.core(History())


@FUZZ
@given(
    data=st.data(),
    index=st.integers(0, len(RECORDS) - 1),
    correct=st.sampled_from(((True, False), (False, False))),
)
def test_lazy_arrival_on_any_facts_header_never_trains_on_a_lie(
    data: st.DataObject, index: int, correct: tuple[bool, ...]
) -> None:
    """A real group under any facts header, through the service's lazy path (facts -> pooled as bytes
    -> verified when picked, or decoded on arrival without usable facts): every step returns a reason
    or raises InvalidMessageError, and a group verified for a batch is exactly what the eager path
    makes of its body, under a header that told the truth."""
    group = real_group(RECORDS[index], "peer-1", correct)
    value = group.SerializeToString()
    headers = data.draw(facts_headers(group))
    core, now = _lazy_core(), time.time()
    sender = Sender("peer-1")
    try:
        facts = arrival_facts(headers, "external", core.screen.cfg)
        if facts is not None:
            reason = core.admit_unread(Unread(value, headers, facts), "h", now, sender)
        else:
            reason = core.admit(parse(value, MAX_BYTES, headers), "external", "h", now, sender)
    except InvalidMessageError as exc:
        assert exc.reason in REASONS
        return
    assert reason is None or reason in REASONS
    [pooled] = core.assembler.pool.entries("external") or [None]
    if pooled is None:
        return
    try:
        verified = core.screen.verify(pooled.scored)
    except InvalidMessageError as exc:
        assert exc.reason in REASONS
        return
    if isinstance(verified, str):
        assert verified in REASONS
        return
    told = wire.read_facts(headers)
    assert told is None or told == wire.group_facts(group)
    eager = Screen(dataclasses.replace(core.screen.cfg, verify=VerifyMode.EAGER), SeenGroups(10))
    assert verified == eager.check(group, "external", now, 0, sender)
