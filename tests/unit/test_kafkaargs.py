"""The connection of `sapo topics` and `sapo keys announce|revoke` (`sapo.kafkaargs`): what reaches
librdkafka from the flags and `SAPO_TOPICS_KAFKA__*` / `SAPO_KEYS_KAFKA__*`, flags over the
environment, secrets only from files or the environment and never printed, bad values named by their
flag or variable before any client starts. (The same flags of `inspect` and `conformance`:
tests/unit/inspect/test_cli.py and tests/unit/test_topics.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sapo import cli as sapo_cli
from sapo.cli import TopicsSettings, build_parser, main
from sapo.identity.cli import KeysSettings
from sapo.identity.keys import NodeKey, write_private
from sapo.kafkaargs import brokers_source
from sapo.topics import TopicSpec

pytestmark = pytest.mark.unit

SECRET = "s3cret-from-file"


class Clients:
    """Stands for the Kafka clients of `sapo topics` (`ensure_topics`) and `sapo keys` (the producer):
    records the librdkafka config each was given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.configs: list[dict[str, str]] = []
        monkeypatch.setattr(sapo_cli, "ensure_topics", self.ensure_topics)
        monkeypatch.setattr(sapo_cli, "KafkaPublisher", self.publisher)

    def ensure_topics(self, config: dict[str, str], specs: list[TopicSpec], timeout_s: float) -> list[str]:
        self.configs.append(config)
        return []

    def publisher(self, config: dict[str, str], setting: str) -> Clients:
        self.configs.append(config)
        return self

    def send_sync(self, topic: str, key: bytes, value: bytes, timeout_s: float) -> tuple[int, int]:
        return 0, 7


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Clients:
    return Clients(monkeypatch)


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "node-0.key"
    write_private(path, NodeKey.generate())
    return path


def commands(key: Path) -> list[tuple[list[str], str]]:
    """(command line without connection flags, its variables' prefix)."""
    return [
        (["topics", "--node", "node-0"], "SAPO_TOPICS_KAFKA__"),
        (["keys", "announce", "--node", "node-0", "--key", str(key)], "SAPO_KEYS_KAFKA__"),
        (
            [
                "keys",
                "revoke",
                "--node",
                "node-0",
                "--key-id",
                NodeKey.generate().key_id,
                "--signer",
                str(key),
            ],
            "SAPO_KEYS_KAFKA__",
        ),
    ]


def test_sasl_ssl_flags_reach_librdkafka_and_the_password_is_never_printed(
    clients: Clients,
    key: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    password = tmp_path / "password"
    password.write_text(f"{SECRET}\n")
    flags = [
        *("--bootstrap", "127.0.0.2:9096", "--security-protocol", "SASL_SSL"),
        *("--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "admin"),
        *("--sasl-password-file", str(password), "--ssl-ca-location", "/etc/kafka/ca.pem"),
        *("-X", "ssl.endpoint.identification.algorithm=https"),
    ]
    caplog.set_level(logging.DEBUG)
    for command, _ in commands(key):
        assert main(["-v", *command, *flags]) == 0
        assert clients.configs.pop() == {
            "bootstrap.servers": "127.0.0.2:9096",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": SECRET,
            "ssl.ca.location": "/etc/kafka/ca.pem",
            "ssl.endpoint.identification.algorithm": "https",
            "client.id": "sapo-swarm",
        }
    out, err = capsys.readouterr()
    assert SECRET not in out + err + caplog.text


def test_mutual_tls_flags_reach_librdkafka(clients: Clients, key: Path, tmp_path: Path) -> None:
    key_password = tmp_path / "key-password"
    key_password.write_text("k3y")
    flags = [
        *("--bootstrap", "127.0.0.2:9094", "--security-protocol", "SSL", "--ssl-ca-location", "ca.pem"),
        *("--ssl-certificate-location", "client.pem", "--ssl-key-location", "client.key"),
        *("--ssl-key-password-file", str(key_password)),
    ]
    for command, _ in commands(key):
        assert main([*command, *flags]) == 0
        config = clients.configs.pop()
        assert config["security.protocol"] == "SSL"
        assert (config["ssl.certificate.location"], config["ssl.key.location"]) == (
            "client.pem",
            "client.key",
        )
        assert config["ssl.key.password"] == "k3y"
        assert "sasl.mechanism" not in config


def test_the_environment_gives_the_connection_and_each_flag_overrides_its_field(
    clients: Clients, key: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for command, prefix in commands(key):
        monkeypatch.setenv(f"{prefix}BOOTSTRAP_SERVERS", "127.0.0.2:9096")
        monkeypatch.setenv(f"{prefix}SECURITY_PROTOCOL", "SASL_SSL")
        monkeypatch.setenv(f"{prefix}SASL_MECHANISM", "PLAIN")
        monkeypatch.setenv(f"{prefix}SASL_USERNAME", "env-user")
        monkeypatch.setenv(f"{prefix}SASL_PASSWORD", SECRET)
        assert main(command) == 0  # no --bootstrap: the environment names the brokers
        config = clients.configs.pop()
        assert (config["bootstrap.servers"], config["security.protocol"]) == ("127.0.0.2:9096", "SASL_SSL")
        assert (config["sasl.username"], config["sasl.password"]) == ("env-user", SECRET)

        assert main([*command, "--bootstrap", "127.0.0.3:9096", "--sasl-username", "flag-user"]) == 0
        config = clients.configs.pop()
        assert (config["bootstrap.servers"], config["sasl.username"]) == ("127.0.0.3:9096", "flag-user")
        assert (config["sasl.mechanism"], config["sasl.password"]) == ("PLAIN", SECRET)  # still the env's
    assert SECRET not in "".join(capsys.readouterr())


def test_with_neither_flag_nor_variable_the_default_brokers_are_used_as_by_inspect(
    clients: Clients, key: Path
) -> None:
    """As `sapo inspect`: the connection's default, 127.0.0.1:9092; a failure to reach it names both
    ways to set the brokers."""
    for command, _ in commands(key):
        assert main(command) == 0
        assert clients.configs.pop()["bootstrap.servers"] == "127.0.0.1:9092"
    topics = build_parser().parse_args(["topics", "--node", "node-0"])
    assert brokers_source(TopicsSettings, topics) == (
        "--bootstrap or SAPO_TOPICS_KAFKA__BOOTSTRAP_SERVERS (unset: the default)"
    )


def test_what_gave_the_brokers_is_named_by_its_flag_or_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    revoke = ["keys", "revoke", "--node", "n", "--key-id", "0" * 32, "--signer", "k"]
    monkeypatch.setenv("sapo_keys_kafka__bootstrap_servers", "127.0.0.2:9092")
    assert brokers_source(KeysSettings, build_parser().parse_args(revoke)) == (
        "sapo_keys_kafka__bootstrap_servers"
    )
    given = build_parser().parse_args([*revoke, "--bootstrap", "127.0.0.3:9092"])
    assert brokers_source(KeysSettings, given) == "--bootstrap"


@pytest.mark.usefixtures("clients")
def test_a_bad_value_is_named_by_its_flag_or_variable_before_any_client_starts(
    key: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for command, prefix in commands(key):
        cases = [
            (["--sasl-password-file", str(tmp_path / "missing")], f"--sasl-password-file {tmp_path}/missing"),
            (["--security-protocol", "SASL_SSL"], "needs sasl_mechanism; set KAFKA__SASL_MECHANISM"),
            (
                [
                    "--bootstrap",
                    "SSL://localhost:9093",
                    "--security-protocol",
                    "SASL_SSL",
                    "--sasl-mechanism",
                    "X",
                ],
                "  --security-protocol: Value error, KAFKA__BOOTSTRAP_SERVERS names the scheme SSL://",
            ),
            (["-X", "bootstrap.servers=127.0.0.1:1"], "  -X: Value error, bootstrap.servers is the brokers"),
        ]
        for flags, message in cases:
            caplog.clear()
            assert main([*command, *flags]) == 2
            assert message in caplog.text, (flags, caplog.text)
        monkeypatch.setenv(f"{prefix}SECURITY_PROTOCOL", "TLS")
        caplog.clear()
        assert main(command) == 2
        assert f"  {prefix}SECURITY_PROTOCOL: Input should be 'PLAINTEXT'" in caplog.text
        monkeypatch.delenv(f"{prefix}SECURITY_PROTOCOL")
        for flags, message in (
            (["--security-protocol", "TLS"], "argument --security-protocol: invalid choice: 'TLS'"),
            (["-X", "acks"], "argument -X: 'acks': use KEY=VALUE (a librdkafka property)"),
            (["--bootstrap", "localhost:99999"], "argument --bootstrap: must name the brokers as HOST:PORT"),
        ):
            with pytest.raises(SystemExit) as exc:
                main([*command, *flags])
            assert exc.value.code == 2
            assert message in capsys.readouterr().err
