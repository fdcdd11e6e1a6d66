"""The wire contract: round trips, forward compatibility, validation reasons, codegen drift (signing:
tests/unit/identity)."""

from __future__ import annotations

import filecmp
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from sapo import wire
from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2, work_pb2
from tests.factories import make_group

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_rollout_group_round_trip() -> None:
    group = make_group()
    data = group.SerializeToString()
    back = wire.decode(rollout_pb2.RolloutGroup, data, max_bytes=1 << 20)
    assert back == group
    assert wire.validate_rollout_group(back) is None


def _newer_rollout_group_class() -> type:
    """A RolloutGroup as a newer minor schema would define it: one extra field (number 99)."""
    fdp = descriptor_pb2.FileDescriptorProto()
    rollout_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = "sapo/v1/rollout_next.proto"
    fdp.package = "sapo.next"
    msg = next(m for m in fdp.message_type if m.name == "RolloutGroup")
    msg.field.add(name="future_field", number=99, type=9, label=1)  # TYPE_STRING, LABEL_OPTIONAL
    pool = descriptor_pool.DescriptorPool()
    for dep in ("google/protobuf/timestamp.proto", "sapo/v1/question.proto"):
        dep_proto = descriptor_pb2.FileDescriptorProto()
        descriptor_pool.Default().FindFileByName(dep).CopyToProto(dep_proto)
        pool.Add(dep_proto)
    for m in fdp.message_type:
        for f in m.field:
            if f.type_name.startswith(".sapo.v1.") and f.type_name.split(".")[-1] in {
                t.name for t in fdp.message_type
            } | {e.name for e in fdp.enum_type}:
                f.type_name = ".sapo.next." + f.type_name.split(".")[-1]
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sapo.next.RolloutGroup"))


def test_newer_minor_schema_decodes_and_unknown_fields_survive() -> None:
    newer_cls = _newer_rollout_group_class()
    newer = newer_cls()
    newer.ParseFromString(make_group(node_id="node-b").SerializeToString())
    newer.future_field = "from the future"
    data = newer.SerializeToString()

    old = wire.decode(rollout_pb2.RolloutGroup, data, max_bytes=1 << 20)
    assert old.node_id == "node-b"
    assert wire.validate_rollout_group(old) is None
    # Re-serialised by an old reader (e.g. a sampler forwarding it), the field is still there.
    again = newer_cls()
    again.ParseFromString(old.SerializeToString())
    assert again.future_field == "from the future"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty_payload"),
        (b"", "empty_payload"),  # zero bytes parse as a message of defaults: schema_version 0
        (b"\xff\xff\xff\xff", "undecodable"),
        (b"x" * 2048, "oversized"),
    ],
)
def test_decode_failures_have_reasons(value: bytes | None, reason: str) -> None:
    with pytest.raises(wire.InvalidMessageError) as info:
        wire.decode(rollout_pb2.RolloutGroup, value, max_bytes=1024)
    assert info.value.reason == reason


def test_unknown_schema_version_rejected() -> None:
    group = make_group()
    group.schema_version = 2
    with pytest.raises(wire.InvalidMessageError, match="schema_version"):
        wire.decode(rollout_pb2.RolloutGroup, group.SerializeToString(), max_bytes=1 << 20)


def test_another_message_type_is_named_as_such() -> None:
    """A message that sets no schema_version (another type, or not one of ours) said only "0 != 1"."""
    work = work_pb2.WorkItem(node_id="node-a", round=3).SerializeToString()  # schema_version unset
    with pytest.raises(wire.InvalidMessageError, match=r"no schema_version: not a RolloutGroup") as error:
        wire.decode(rollout_pb2.RolloutGroup, work, max_bytes=1 << 20)
    assert error.value.reason == "schema_version"


def test_structural_validation_reasons() -> None:
    bad_id = make_group(group_id="not-a-uuid")
    assert wire.validate_rollout_group(bad_id) == "bad_group_id"
    no_completions = make_group(rewards=())
    assert wire.validate_rollout_group(no_completions) == "no_completions"
    mismatch = make_group()
    mismatch.completions[0].logprobs.append(-1.0)
    assert wire.validate_rollout_group(mismatch) == "logprob_length_mismatch"
    unspecified = make_group()
    unspecified.completions[1].finish_reason = rollout_pb2.FINISH_REASON_UNSPECIFIED
    assert wire.validate_rollout_group(unspecified) == "missing_finish_reason"
    largest = make_group(rewards=[float(i % 2) for i in range(wire.MAX_GROUP_COMPLETIONS)])
    assert wire.validate_rollout_group(largest) is None
    largest.completions.add().CopyFrom(largest.completions[0])
    assert wire.validate_rollout_group(largest) == "too_many_completions"
    # With identity off a peer's claimed id is trusted, and it lands in metric labels, logs and batches.
    for node in ("x" * 100_000, "node\n-a", "Node-A", "-a", "n" * 49):
        assert wire.validate_rollout_group(make_group(node_id=node)) == "bad_node_id", node
    assert wire.validate_rollout_group(make_group(node_id="n" * 48)) is None


def test_batch_and_policy_validation() -> None:
    batch = batch_pb2.TrainingBatch(batch_id="n/0", groups=[batch_pb2.BatchGroup(group=make_group())])
    assert wire.validate_batch(batch) == "missing_source"
    batch.groups[0].source = batch_pb2.GROUP_SOURCE_LOCAL
    assert wire.validate_batch(batch) == "reward_length_mismatch"
    batch.groups[0].rewards.extend([1, 0, 0, 1])
    batch.groups[0].advantages.extend([1, -1, -1, 1])
    assert wire.validate_batch(batch) is None
    batch.groups.extend([batch.groups[0]] * (wire.MAX_BATCH_GROUPS - 1))
    assert wire.validate_batch(batch) is None
    batch.groups.add().CopyFrom(batch.groups[0])
    assert wire.validate_batch(batch) == "too_many_groups"
    wide = batch_pb2.BatchGroup(source=batch_pb2.GROUP_SOURCE_EXTERNAL)
    wide.group.CopyFrom(make_group(rewards=[float(i % 2) for i in range(wire.MAX_GROUP_COMPLETIONS + 1)]))
    wide.rewards.extend(c.reward for c in wide.group.completions)
    wide.advantages.extend(0.0 for _ in wide.group.completions)
    lone = batch_pb2.TrainingBatch(batch_id="n/1", groups=[wide])
    assert wire.validate_batch(lone) == "too_many_completions"
    update = policy_pb2.PolicyUpdate(node_id="n", manifest_uri="file:///x", manifest_sha256="a" * 64)
    assert wire.validate_policy_update(update) is None
    assert wire.validate_policy_update(policy_pb2.PolicyUpdate(node_id="n")) == "incomplete_policy_update"


def test_generated_code_matches_proto_sources(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts/gen_proto.py"), str(tmp_path)], check=True)
    for generated in sorted((tmp_path / "sapo/v1").iterdir()):
        committed = ROOT / "sapo/v1" / generated.name
        assert committed.exists(), f"{committed} missing: run `make proto`"
        assert filecmp.cmp(generated, committed, shallow=False), f"{committed} is stale: run `make proto`"


def test_a_groups_facts_header_restates_its_body() -> None:
    group = make_group(rewards=[1.0, 0.0, 1.0])
    group.round = 7
    group.completions[2].finish_reason = rollout_pb2.FINISH_REASON_ERROR
    value = group.SerializeToString()
    headers = dict(wire.rollout_headers(group, value))
    facts = wire.read_facts(headers)
    assert facts == wire.group_facts(group)
    assert facts is not None
    assert (facts.group_id, facts.round, facts.scored, facts.signal) == (group.group_id, 7, 2, True)
    assert facts.completed_s == group.completed_at.seconds + group.completed_at.nanos / 1e9
    assert wire.facts_problem(group, headers) is None
    group.completions[0].reward = 0.0  # the body no longer claims a spread its header still states
    assert wire.facts_problem(group, headers) == "facts_mismatch"


FACTS_ID = b"5b0e6c1f-3f1e-4c55-9a4e-2f8f0c6a3d11"
"""A group id in its one spelling: each malformed header below is refused for the field it names."""


@pytest.mark.parametrize(
    "raw",
    [
        b"f1;",
        b"f1;%s;1;2;3;d;1;2" % FACTS_ID,
        b"f1;%s;x;2;3;d;1;2;1" % FACTS_ID,
        b"f1;%s;-1;2;3;d;1;2;1" % FACTS_ID,
        b"f1;%s;1;2;1000000000;d;1;2;1" % FACTS_ID,
        b"f1;%s;1;2;3;d;1;2;2" % FACTS_ID,
        b"f1;%s;1;2;3;\xffd;1;2;1" % FACTS_ID,  # a text field that is not ASCII
        b"f1;id;1;2;3;d;1;2;1",  # a group id that is no UUID
    ],
)
def test_a_malformed_facts_header_is_a_facts_mismatch(raw: bytes) -> None:
    assert wire.read_facts({wire.H_FACTS: b"f1;%s;1;2;3;d;1;2;1" % FACTS_ID}) is not None  # the form
    with pytest.raises(wire.InvalidMessageError) as info:
        wire.read_facts({wire.H_FACTS: raw})
    assert info.value.reason == "facts_mismatch"


def test_a_group_id_has_one_spelling() -> None:
    """`uuid.UUID` reads one UUID under endless spellings: copies of one group under each passed the
    dedupe by id into one batch. Refused in the body and in the facts header a lazy sampler pools on."""
    canonical = str(uuid.uuid4())
    assert wire.validate_rollout_group(make_group(group_id=canonical)) is None
    spellings = [canonical.upper(), f"{{{canonical}}}", f"urn:uuid:{canonical}", canonical.replace("-", "")]
    for spelling in [*spellings, "-" * 300_000 + canonical]:
        group = make_group(group_id=spelling)
        assert wire.validate_rollout_group(group) == "bad_group_id", spelling[:50]
        with pytest.raises(wire.InvalidMessageError) as info:
            wire.read_facts({wire.H_FACTS: wire.encode_facts(wire.group_facts(group))})
        assert info.value.reason == "facts_mismatch"


def test_a_missing_or_later_facts_header_is_no_claim() -> None:
    group = make_group()
    assert wire.read_facts({}) is None
    assert wire.read_facts({wire.H_FACTS: b"f2;whatever it says"}) is None
    assert wire.facts_problem(group, {wire.H_FACTS: b"f2;whatever it says"}) is None


def test_the_generator_config_header_is_written_when_given_and_read_only_in_its_form() -> None:
    group = make_group()
    value = group.SerializeToString()
    config = "0123456789abcdef"
    plain, marked = (
        wire.rollout_headers(group, value),
        wire.rollout_headers(group, value, generator_config=config),
    )
    assert marked == [*plain, (wire.H_GENERATOR_CONFIG, config.encode())]  # the rest as before
    assert wire.read_generator_config(dict(marked)) == config
    assert wire.read_generator_config(dict(plain)) is None  # an older generator
    for raw in (b"", b"0123", config.upper().encode(), config.encode() + b"0", b"\xff" * 16, b"g" * 16):
        assert wire.read_generator_config({wire.H_GENERATOR_CONFIG: raw}) is None


def test_a_rejection_quotes_at_most_a_bounded_detail() -> None:
    """Details quote what a sender wrote (a 300 KB node id header, say) into log lines and headers."""
    error = wire.InvalidMessageError("identity_mismatch", "sent by " + "n" * 300_000)
    assert len(error.detail) < wire.MAX_DETAIL_CHARS + 40
    assert error.detail.endswith(f"... ({300_008 - wire.MAX_DETAIL_CHARS} more characters)")
    assert str(error) == f"identity_mismatch: {error.detail}"
    assert wire.InvalidMessageError("oversized", "2048 bytes > 1024").detail == "2048 bytes > 1024"
