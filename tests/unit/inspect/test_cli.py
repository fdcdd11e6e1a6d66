"""`sapo inspect` arguments: topic shorthands, --since, and the connection settings (environment,
flags over it, secrets from the environment or files, invalid combinations refused with what to set)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sapo.cli import build_parser
from sapo.inspect.cli import parse_since, resolve_topics, settings_from
from sapo.settings import ConfigError

pytestmark = pytest.mark.unit
TOPICS = [
    "other.thing",
    "sapo.node.node-0.batches",
    "sapo.node.node-0.dlq",
    "sapo.node.node-1.rollouts",
    "sapo.node.node-10.dlq",
    "sapo.swarm.rollouts",
]


def test_topic_shorthands() -> None:
    existing = lambda: TOPICS  # noqa: E731
    assert resolve_topics(["swarm", "keys"], "sapo", existing) == ["sapo.swarm.rollouts", "sapo.swarm.keys"]
    assert resolve_topics(["node-0/dlq", "node-0/work"], "p", existing) == [
        "p.node.node-0.dlq",
        "p.node.node-0.work",
    ]
    assert resolve_topics(["node-0"], "sapo", existing) == [
        "sapo.node.node-0.batches",
        "sapo.node.node-0.dlq",
    ]
    assert resolve_topics(["all"], "sapo", existing) == TOPICS[1:]
    assert resolve_topics(["x.y", "swarm", "sapo.swarm.rollouts"], "sapo", existing) == [
        "x.y",
        "sapo.swarm.rollouts",
    ]
    with pytest.raises(ValueError, match="one of rollouts, batches, policy, dlq, work"):
        resolve_topics(["node-0/logs"], "sapo", existing)
    with pytest.raises(ValueError, match="no topics of node 'node-9'"):
        resolve_topics(["node-9"], "sapo", existing)
    with pytest.raises(ValueError, match="no topics matched"):
        resolve_topics(["all"], "nothing", existing)


@pytest.mark.parametrize(
    ("topic", "message"),
    [
        ("bad topic!", "'bad topic!' is neither a node id nor a topic name: TOPIC is swarm, keys, all"),
        ("a" * 250, "is neither a node id nor a topic name"),
        ("..", "is neither a node id nor a topic name"),
        ("Node_0/dlq", "invalid node id 'Node_0'"),
        ("node-0/logs", "the role after '/' is one of rollouts"),
    ],
)
def test_a_topic_argument_that_is_neither_a_node_nor_a_topic_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], topic: str, message: str
) -> None:
    with pytest.raises(SystemExit) as usage:
        build_parser().parse_args(["inspect", "--bootstrap", "127.0.0.1:1", topic])
    assert usage.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("sapo inspect: error: argument TOPIC: ") and message in error


def test_a_name_that_is_no_node_id_reads_as_a_topic_name() -> None:
    assert resolve_topics(["Team_Topic", "node-0"], "sapo", lambda: TOPICS) == [
        "Team_Topic",
        "sapo.node.node-0.batches",
        "sapo.node.node-0.dlq",
    ]


def test_since() -> None:
    now = 1_000_000.0
    assert parse_since("90s", now) == (now - 90) * 1000
    assert parse_since("10m", now) == (now - 600) * 1000
    assert parse_since("1.5h", now) == (now - 5400) * 1000
    assert parse_since("1970-01-01T00:01:00", now) == 60_000
    assert parse_since("1970-01-01T01:01:00+01:00", now) == 60_000
    with pytest.raises(argparse.ArgumentTypeError, match="neither a duration"):
        parse_since("yesterday", now)


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["inspect", "swarm", *argv])


def test_flags_override_the_environment_and_secrets_come_from_env_or_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SAPO_INSPECT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.2:9092")  # checked: it resolves
    monkeypatch.setenv("SAPO_INSPECT_KAFKA__SASL_USERNAME", "env-user")
    monkeypatch.setenv("SAPO_INSPECT_KAFKA__SASL_PASSWORD", "from-env")
    monkeypatch.setenv("SAPO_INSPECT_TOPIC_PREFIX", "team")
    flags = [
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--ssl-ca-location",
        "/ca.pem",
    ]
    settings = settings_from(args(*flags, "-X", "socket.timeout.ms=5000"))
    conf = settings.consumer_config()
    assert conf["bootstrap.servers"] == "127.0.0.2:9092"
    assert (conf["security.protocol"], conf["sasl.mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (conf["sasl.username"], conf["sasl.password"]) == ("env-user", "from-env")
    assert (conf["ssl.ca.location"], conf["socket.timeout.ms"]) == ("/ca.pem", "5000")
    assert settings.topic_prefix == "team"
    assert "from-env" not in repr(settings) and "from-env" not in str(settings.model_dump())

    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    settings = settings_from(
        args("--bootstrap", "localhost:1", "--sasl-password-file", str(secret), "--prefix", "p")
    )
    assert settings.kafka.bootstrap_servers == "localhost:1"  # a flag's host must resolve
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == "from-file"
    assert settings.topic_prefix == "p"


def test_bad_connection_settings_say_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs sasl_mechanism; set KAFKA__SASL_MECHANISM"):
        settings_from(args("--security-protocol", "SASL_SSL"))
    with pytest.raises(ConfigError, match=r"SAPO_INSPECT_KAFKA: .*needs KAFKA__SASL_USERNAME"):
        settings_from(args("--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN"))
    with pytest.raises(ConfigError, match=r"--sasl-password-file .*: No such file"):
        settings_from(args("--sasl-password-file", str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"--idle: .*shorter than two fetch waits"):
        settings_from(args("--idle", "0.1"))
    monkeypatch.setenv("SAPO_INSPECT_KAFKA_BOOTSTRAP", "typo")
    with pytest.raises(ConfigError, match="unknown setting"):
        settings_from(args())


def test_a_since_before_1970_reads_from_the_beginning() -> None:
    """A negative time reached Kafka's offset lookup, which failed it as a broker transport failure
    (`--since 9999999d`) or read -1 as the end of the topic."""
    now = 1_700_000_000
    assert parse_since("9999999d", now) == 0
    assert parse_since("1900-01-01", now) == 0
    assert parse_since("1969-12-31T23:59:59.999", now) == 0
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--since 'yesterday' is neither"):
        parse_since("yesterday", now)


def test_a_duration_is_wall_time_not_bounded_by_the_kafka_clients_waits() -> None:
    """--duration ends a --follow read by the clock; librdkafka's int32 milliseconds never see it, so a
    month of watching is a valid value (it was refused as beyond ~24 days)."""
    assert args("--follow", "--duration", "2592000").duration == 2_592_000.0
    with pytest.raises(SystemExit):
        args("--duration", "0")
