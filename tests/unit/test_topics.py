"""Topic naming and validation: no broker needed."""

from __future__ import annotations

import dataclasses

import pytest

from sapo.cli import main
from sapo.cliargs import bootstrap_servers
from sapo.topics import (
    DEFAULT_MAX_MESSAGE_BYTES,
    WORK_PARTITIONS,
    TopicNames,
    TopicSpec,
    ensure_topics,
    validate_node_id,
    validate_topic_name,
)

pytestmark = pytest.mark.unit


def test_default_names_follow_design() -> None:
    names = TopicNames.for_node("node-0")
    assert names.swarm_rollouts == "sapo.swarm.rollouts"
    assert names.rollouts == "sapo.node.node-0.rollouts"
    assert names.batches == "sapo.node.node-0.batches"
    assert names.policy == "sapo.node.node-0.policy"
    assert names.dlq == "sapo.node.node-0.dlq"


def test_prefix_applies_to_every_topic() -> None:
    names = TopicNames.for_node("a1", prefix="lab_7.x")
    assert names.swarm_rollouts == "lab_7.x.swarm.rollouts"
    assert names.policy == "lab_7.x.node.a1.policy"


def test_single_names_can_be_overridden_but_stay_validated() -> None:
    names = dataclasses.replace(TopicNames.for_node("n1"), swarm_rollouts="shared.rollouts")
    assert names.swarm_rollouts == "shared.rollouts"
    with pytest.raises(ValueError, match="invalid topic name"):
        dataclasses.replace(names, dlq="has space")


def test_specs_compact_the_single_partition_policy_keys_and_leases_topics() -> None:
    names = TopicNames.for_node("n1")
    specs = {spec.name: spec for spec in names.specs(partitions=4, replication_factor=3)}
    assert len(specs) == 8
    assert names.swarm_keys == "sapo.swarm.keys"
    limit = {"max.message.bytes": str(DEFAULT_MAX_MESSAGE_BYTES)}
    for compacted in (names.policy, names.swarm_keys, names.leases):
        assert specs[compacted].config == {"cleanup.policy": "compact"} | limit
        assert specs[compacted].partitions == 1
    assert specs[names.batches].partitions == 1  # batches are steps: trained in order
    assert specs[names.work].partitions == WORK_PARTITIONS
    assert all(s.replication_factor == 3 for s in specs.values())
    fixed = (names.policy, names.swarm_keys, names.leases, names.batches, names.work)
    others = [spec for name, spec in specs.items() if name not in fixed]
    assert all(s.partitions == 4 and s.config == limit for s in others)
    raised = names.specs(max_message_bytes=8 << 20)
    assert {s.config["max.message.bytes"] for s in raised} == {str(8 << 20)}


@pytest.mark.parametrize("node_id", ["a", "node-0", "0", "x" * 48, "gpu-box-3"])
def test_valid_node_ids(node_id: str) -> None:
    assert validate_node_id(node_id) == node_id


@pytest.mark.parametrize(
    "node_id",
    [
        "",
        "Node",
        "node_0",
        "node.0",
        "-node",
        "x" * 49,
        "nöde",
        "a b",
        "node-0\n",
    ],  # '$' alone took a final \n
)
def test_invalid_node_ids_say_what_is_allowed(node_id: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters, digits and '-'"):
        validate_node_id(node_id)
    with pytest.raises(ValueError, match="invalid node id"):
        TopicNames.for_node(node_id)


@pytest.mark.parametrize("prefix", ["", "a b", "x" * 65, "sapo!", "sapo\n"])
def test_invalid_prefix_is_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid topic prefix"):
        TopicNames.for_node("n1", prefix=prefix)


@pytest.mark.parametrize("name", [".", "..", "", "a/b", "x" * 250, "topic\n"])
def test_kafka_topic_name_rules(name: str) -> None:
    with pytest.raises(ValueError, match="invalid topic name"):
        validate_topic_name(name)


def test_spec_bounds() -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        TopicSpec("t", partitions=0)
    with pytest.raises(ValueError, match="replication_factor must be >= 1"):
        TopicSpec("t", replication_factor=0)


def test_conflicting_specs_fail_before_connecting() -> None:
    conflicting = [TopicSpec("t", partitions=1), TopicSpec("t", partitions=2)]
    with pytest.raises(ValueError, match="specified twice"):
        ensure_topics({"bootstrap.servers": "127.0.0.1:1"}, conflicting, timeout_s=1.0)


def test_cli_rejects_invalid_node_id_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["topics", "--bootstrap", "127.0.0.1:1", "--node", "Node_1"])
    assert exit_info.value.code == 2
    assert "invalid node id 'Node_1'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["topics", "--node", "node-0"],
        ["keys", "revoke", "--node", "node-0", "--key-id", "0" * 32, "--signer", "old.key"],
        ["inspect", "swarm"],
        ["conformance", "sampler", "--node", "node-0"],
    ],
)
def test_every_bootstrap_flag_refuses_an_empty_or_unresolvable_value_before_connecting(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """librdkafka reports both only as a generic transport failure, after the whole timeout."""
    for bootstrap, message in (
        ("", "argument --bootstrap: must name the brokers as HOST:PORT"),
        ("broker:", "argument --bootstrap: must name the brokers as HOST:PORT"),
        ("localhost:99999", "argument --bootstrap: must name the brokers as HOST:PORT"),
        ("no-such-host.invalid", "could not resolve host 'no-such-host.invalid'"),  # port 9092, as librdkafka
        (
            "no-such-host.invalid:9092",
            "could not resolve host 'no-such-host.invalid' of 'no-such-host.invalid:9092'",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--bootstrap", bootstrap])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_a_bootstrap_list_in_any_form_librdkafka_takes_is_accepted() -> None:
    for value in (
        "localhost",
        "localhost:9092",
        "PLAINTEXT://127.0.0.1:9092, localhost",
        "SASL_SSL://localhost:9093",
        "[::1]:9093",
        "[::1]",
        "::1",
        "localhost:9092,",
    ):
        assert bootstrap_servers(value) == value
