"""Topic naming and validation, and the broker lists of the commands: no broker needed."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from sapo import cli as sapo_cli
from sapo.cli import main
from sapo.cliargs import BROKER_SCHEMES, BrokerAddress, bootstrap_servers, broker_addresses
from sapo.conformance import cli as conformance_cli
from sapo.identity.keys import NodeKey, write_private
from sapo.inspect import cli as inspect_cli
from sapo.inspect.reader import InspectError
from sapo.settings import SecurityProtocol
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
        "plaintext://localhost:9092",
        "[fe80::1]:9092",
    ):
        assert bootstrap_servers(value) == value
    assert broker_addresses("kafka-0.kafka_headless.ns.svc.cluster.local.:9092")  # the form only
    assert broker_addresses("SSL://[::1]:9093, localhost,") == (
        BrokerAddress("SSL", "::1", 9093),
        BrokerAddress(None, "localhost", 9092),
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("h:0", "the port '0' is not a number from 1 to 65535"),
        ("a:1,b:65536", "the port '65536' of 'b:65536' is not a number from 1 to 65535"),
        (
            "h:\uff19\uff10\uff19\uff12",
            "is not a number",
        ),  # full-width digits: int() reads them, librdkafka not
        ("h:9092/", "is not a number"),
        ("http://h:9092", "the scheme http:// is none of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ("://h:9092", "the scheme :// is none of"),
        ("[h]:9092", "'h' in brackets is not an IPv6 address"),
        ("[::1", "is neither [IPv6] nor [IPv6]:PORT"),
        ("[::1]9092", "is neither [IPv6] nor [IPv6]:PORT"),
        ("a:b:c", "is neither HOST:PORT nor an IPv6 address"),
        (":9092", "'' is not a host name"),
        ("a b:9092", "'a b' is not a host name"),
        (
            "b\u00fccher.example:9092",
            "is not a host name (ASCII letters",
        ),  # Python would encode it, librdkafka not
        ("a..b:9092", "is not a host name"),
        ("x" * 64 + ".example:9092", "is not a host name"),
    ],
)
def test_a_broker_list_librdkafka_would_misread_or_drop_is_refused_by_its_form(
    value: str, reason: str
) -> None:
    with pytest.raises(ValueError, match="must name the brokers as HOST:PORT") as error:
        broker_addresses(value)
    assert f"{value!r} is not: " in str(error.value) and reason in str(error.value)


def test_the_schemes_a_broker_list_may_name_are_the_security_protocols() -> None:
    assert set(BROKER_SCHEMES) == {protocol.value for protocol in SecurityProtocol}


ENV_COMMANDS = [
    (["inspect", "swarm"], "SAPO_INSPECT_KAFKA__BOOTSTRAP_SERVERS"),
    (["conformance", "sampler", "--node", "node-0"], "SAPO_CONFORMANCE_KAFKA__BOOTSTRAP_SERVERS"),
    (["topics", "--node", "node-0"], "SAPO_TOPICS_KAFKA__BOOTSTRAP_SERVERS"),
    (
        ["keys", "revoke", "--node", "node-0", "--key-id", "0" * 32, "--signer", "signer.key"],
        "SAPO_KEYS_KAFKA__BOOTSTRAP_SERVERS",
    ),
]
"""The commands that take the connection flags over `SAPO_<COMMAND>_KAFKA__*` (`sapo.kafkaargs`);
`keys revoke` reads its signer from the working directory (`signer`)."""


def fake_clients(monkeypatch: pytest.MonkeyPatch, client: Callable[..., object]) -> None:
    """`client` stands for each command's Kafka client, called with its librdkafka config first."""
    monkeypatch.setattr(inspect_cli, "TopicReader", client)
    monkeypatch.setattr(conformance_cli, "run_kit", client)
    monkeypatch.setattr(sapo_cli, "ensure_topics", client)
    monkeypatch.setattr(sapo_cli, "KafkaPublisher", client)


@pytest.fixture
def signer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The signer.key of `keys revoke` in ENV_COMMANDS, in a fresh working directory."""
    write_private(tmp_path / "signer.key", NodeKey.generate())
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_kafka_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that gets as far as starting its Kafka client fails the test."""

    def started(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("the command started a Kafka client")

    fake_clients(monkeypatch, started)


def error_lines(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


@pytest.mark.usefixtures("no_kafka_client")
@pytest.mark.parametrize(("command", "variable"), ENV_COMMANDS)
@pytest.mark.parametrize(
    ("bootstrap", "message"),
    [
        (
            "no-such-host.invalid:9092",
            "could not resolve host 'no-such-host.invalid' of 'no-such-host.invalid:9092'",
        ),
        ("no-such-host.invalid", "could not resolve host 'no-such-host.invalid'"),  # port 9092
        ("localhost:9092,no-such-host.invalid:9092", "could not resolve host 'no-such-host.invalid'"),
        ("", "must name the brokers as HOST:PORT"),
        (" , ", "it names no broker"),
        ("broker:", "the port '' is not a number from 1 to 65535"),
        ("localhost:99999", "the port '99999' is not a number from 1 to 65535"),
        ("http://localhost:9092", "the scheme http:// is none of"),
    ],
)
def test_brokers_from_the_environment_are_checked_as_the_flag_checks_them(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    *,
    command: list[str],
    variable: str,
    bootstrap: str,
    message: str,
) -> None:
    """Usage errors naming the variable, before any Kafka client starts (librdkafka would wait out the
    command's whole timeout and report a generic transport failure)."""
    monkeypatch.setenv(variable, bootstrap)
    assert main(command) == 2
    error = error_lines(caplog)
    assert f"{variable}: " in error and message in error, error


@pytest.mark.usefixtures("no_kafka_client")
@pytest.mark.parametrize(("command", "variable"), ENV_COMMANDS)
def test_the_variable_is_named_as_it_was_spelled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, command: list[str], variable: str
) -> None:
    monkeypatch.setenv(variable.lower(), "no-such-host.invalid:9092")  # pydantic-settings reads any case
    assert main(command) == 2
    assert error_lines(caplog).startswith(
        f"{variable.lower()}: could not resolve host 'no-such-host.invalid'"
    )
    caplog.clear()
    monkeypatch.delenv(variable.lower())
    connection = variable.removesuffix("__BOOTSTRAP_SERVERS")  # the whole connection as JSON
    monkeypatch.setenv(connection, json.dumps({"bootstrap_servers": "no-such-host.invalid:9092"}))
    assert main(command) == 2
    assert error_lines(caplog).startswith(f"{connection}: could not resolve host 'no-such-host.invalid'")


@pytest.mark.usefixtures("signer")
@pytest.mark.parametrize(("command", "variable"), ENV_COMMANDS)
def test_the_flag_overrides_a_bad_variable(
    monkeypatch: pytest.MonkeyPatch, command: list[str], variable: str
) -> None:
    reached: list[str] = []

    def unreachable(config: object, *args: object, **kwargs: object) -> NoReturn:
        reached.append("client")
        raise InspectError("no broker")

    fake_clients(monkeypatch, unreachable)
    monkeypatch.setenv(variable, "no-such-host.invalid:9092")
    assert main([*command, "--bootstrap", "127.0.0.1:1"]) == 1
    assert reached == ["client"]


@pytest.mark.usefixtures("no_kafka_client")
@pytest.mark.parametrize(("command", "variable"), ENV_COMMANDS)
def test_no_extra_property_names_other_brokers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, command: list[str], variable: str
) -> None:
    """`-X bootstrap.servers=...` (or its alias) would bypass the check: the flags and variables that
    name the brokers are the only way."""
    assert main([*command, "-X", "metadata.broker.list=no-such-host.invalid:9092"]) == 2
    assert "  -X: Value error, metadata.broker.list is the brokers" in error_lines(caplog)
    caplog.clear()
    extra = variable.replace("BOOTSTRAP_SERVERS", "EXTRA")
    monkeypatch.setenv(extra, json.dumps({"bootstrap.servers": "no-such-host.invalid:9092"}))
    assert main(command) == 2
    assert f"  {extra}: Value error, bootstrap.servers is the brokers" in error_lines(caplog)


@pytest.mark.usefixtures("no_kafka_client")
@pytest.mark.parametrize(("command", "variable"), ENV_COMMANDS)
def test_a_scheme_other_than_the_security_protocol_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, command: list[str], variable: str
) -> None:
    """librdkafka drops such a broker and then reports only a transport failure."""
    monkeypatch.setenv(variable, "SSL://localhost:9093")
    assert main(command) == 2
    assert "names the scheme SSL:// but security_protocol is PLAINTEXT" in error_lines(caplog)


def test_a_swarm_on_brokers_that_do_not_resolve_starts_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = tmp_path / "swarm.yaml"
    manifest.write_text("bootstrap: no-such-host.invalid:9092\nnodes: [{id: a, rounds: 1}]\n")
    assert main(["swarm", "--manifest", str(manifest), "--run-dir", str(tmp_path / "run")]) == 2
    assert f"bootstrap of swarm manifest {manifest}: could not resolve host" in error_lines(caplog)
    assert not (tmp_path / "run").exists()
    caplog.clear()
    manifest.write_text("bootstrap: 'localhost:99999'\nnodes: [{id: a, rounds: 1}]\n")
    assert main(["swarm", "--manifest", str(manifest), "--run-dir", str(tmp_path / "run")]) == 2
    assert "  bootstrap: Value error, must name the brokers" in error_lines(caplog)


def test_a_swarm_whose_brokers_do_not_answer_ends_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The launcher creates the topics first: a broker that resolves but never answers (nothing listens
    on its port) fails that step after its timeout, with the topics' error and not a traceback."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    manifest = tmp_path / "swarm.yaml"
    manifest.write_text(f"bootstrap: '127.0.0.1:{port}'\nnodes: [{{id: a, rounds: 1}}]\n")
    assert main(["swarm", "--manifest", str(manifest), "--run-dir", str(tmp_path / "run")]) == 1
    assert "Traceback" not in caplog.text
    assert error_lines(caplog).startswith(f"could not list topics at 127.0.0.1:{port} within 30 s")


@pytest.mark.parametrize("scheme", ["SSL", "sasl_ssl", "SASL_PLAINTEXT"])
def test_a_swarm_manifest_names_no_scheme_but_plaintext(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, scheme: str
) -> None:
    """The launcher's own clients (topics, recorder) and its services connect in PLAINTEXT, which
    librdkafka would refuse such a broker in: the swarm would wait out its timeouts and fail."""
    manifest = tmp_path / "swarm.yaml"
    manifest.write_text(f"bootstrap: '{scheme}://localhost:9093'\nnodes: [{{id: a, rounds: 1}}]\n")
    assert main(["swarm", "--manifest", str(manifest), "--run-dir", str(tmp_path / "run")]) == 2
    assert f"the scheme {scheme.upper()}:// is not PLAINTEXT://" in error_lines(caplog)
    assert not (tmp_path / "run").exists()
    manifest.write_text("bootstrap: 'plaintext://no-such-host.invalid:9092'\nnodes: [{id: a, rounds: 1}]\n")
    caplog.clear()
    assert main(["swarm", "--manifest", str(manifest), "--run-dir", str(tmp_path / "run")]) == 2
    assert "could not resolve host 'no-such-host.invalid'" in error_lines(caplog)  # the form was taken


@pytest.mark.usefixtures("no_kafka_client")
def test_a_scheme_mismatch_names_the_security_protocol_by_its_flag_or_variable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not the whole connection's variable (SAPO_INSPECT_KAFKA), which nothing set: the setting that
    differs from the scheme, as the user can change it."""
    assert (
        main(["inspect", "swarm", "--bootstrap", "SSL://localhost:9093", "--security-protocol", "PLAINTEXT"])
        == 2
    )
    assert (
        "  --security-protocol: Value error, KAFKA__BOOTSTRAP_SERVERS names the scheme SSL://"
        in error_lines(caplog)
    )
    caplog.clear()
    assert main(["inspect", "swarm", "--bootstrap", "SSL://localhost:9093"]) == 2
    assert (
        "  SAPO_INSPECT_KAFKA__SECURITY_PROTOCOL: Value error, KAFKA__BOOTSTRAP_SERVERS names"
        in error_lines(caplog)
    )


@pytest.mark.parametrize(
    "command",
    [
        ["topics", "--bootstrap", "127.0.0.1:1", "--node", "node-0", "--partitions"],
        ["topics", "--bootstrap", "127.0.0.1:1", "--node", "node-0", "--replication-factor"],
        ["topics", "--bootstrap", "127.0.0.1:1", "--node", "node-0", "--work-partitions"],
        ["inspect", "--bootstrap", "127.0.0.1:1", "swarm", "--last"],
    ],
)
def test_a_count_no_c_integer_holds_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """They overflowed a C int inside the Kafka client or a deque: an OverflowError traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "99999999999"])
    assert exit_info.value.code == 2
    assert f"argument {command[-1]}: must be <= 2147483647, got 99999999999" in capsys.readouterr().err


TOPICS_COMMAND = ["topics", "--bootstrap", "127.0.0.1:1", "--node", "node-0"]
REVOKE_COMMAND = [
    *("keys", "revoke", "--bootstrap", "127.0.0.1:1", "--node", "node-0"),
    *("--key-id", "0" * 32, "--signer", "k"),
]
"""Commands that would reach for a cluster (nothing listens at 127.0.0.1:1): a usage error stops them
first."""


@pytest.mark.parametrize("command", [TOPICS_COMMAND, REVOKE_COMMAND])
def test_a_timeout_beyond_the_kafka_client_s_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """librdkafka counts in int32 milliseconds: a longer --timeout failed at once, reported as the
    cluster not answering within it."""
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--timeout", "2200000"])
    assert exit_info.value.code == 2
    assert (
        "argument --timeout: must be at most 2147483 seconds (~24 days), got 2200000"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "command",
    [
        TOPICS_COMMAND,
        ["keys", "announce", "--bootstrap", "127.0.0.1:1", "--node", "node-0", "--key", "k"],
        REVOKE_COMMAND,
    ],
)
@pytest.mark.parametrize("prefix", ["", "a b", "sapo\n"])
def test_a_bad_prefix_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], command: list[str], prefix: str
) -> None:
    """`keys` ended in a ValueError traceback, `topics` in exit status 1 without naming the flag."""
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--prefix", prefix])
    assert exit_info.value.code == 2
    assert f"argument --prefix: invalid topic prefix {prefix!r}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1", "65535", "268435457", "99999999999"])
def test_max_message_bytes_the_services_refuse_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """Topics were created with any value >= 1, which no service (MAX_MESSAGE_BYTES) nor the chart takes."""
    with pytest.raises(SystemExit) as exit_info:
        main(["topics", "--bootstrap", "127.0.0.1:1", "--node", "node-0", "--max-message-bytes", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --max-message-bytes: must be 65536..268435456 (the services' MAX_MESSAGE_BYTES)" in err
    assert f"got {value}" in err


@pytest.mark.parametrize("port", ["0", "-1", "65536"])
def test_a_broker_port_out_of_range_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], port: str
) -> None:
    """It was refused as "port must be in 1..65535 (or None for a free one)", naming neither the flag
    nor how to leave it out."""
    with pytest.raises(SystemExit) as exit_info:
        main(["broker", "--port", port])
    assert exit_info.value.code == 2
    assert (
        f"argument --port: must be 1..65535 (leave --port out for a free one), got {port}"
        in capsys.readouterr().err
    )
