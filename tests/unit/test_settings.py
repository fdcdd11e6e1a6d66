"""Settings: env parsing, actionable validation errors, secrets masked, librdkafka edge dict."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic_settings import SettingsConfigDict

from sapo.kafka import TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.ops import Health
from sapo.runtime import open_ops_server, open_publisher, start_runtime, write_port_file
from sapo.sampler.settings import SamplerSettings
from sapo.settings import (
    ConfigError,
    ConsumerProfile,
    KafkaConnection,
    ServiceSettings,
    describe,
    field_bounds,
    load_settings,
)

pytestmark = pytest.mark.unit


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="SAPO_DEMO_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )


def test_env_and_nested_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "node-7")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "b1:9092,b2:9092")
    s = load_settings(DemoSettings)
    assert s.node_id == "node-7"
    assert s.kafka.to_librdkafka()["bootstrap.servers"] == "b1:9092,b2:9092"
    assert s.swarm_connection == s.kafka


def test_missing_and_bad_values_say_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAPO_DEMO_NODE_ID", raising=False)
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings, http_port=70000)
    text = str(info.value)
    assert "SAPO_DEMO_NODE_ID" in text
    assert "SAPO_DEMO_HTTP_PORT" in text
    with pytest.raises(ConfigError, match="SAPO_DEMO_NODE_ID"):
        load_settings(DemoSettings, node_id="Bad Id!")


def test_a_value_a_flag_gave_is_named_by_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAPO_DEMO_NODE_ID", raising=False)
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings, {"http_port": "--port"}, http_port=70000)
    text = str(info.value)
    assert "  --port: Input should be less than or equal to 65535 (got 70000)" in text
    assert "SAPO_DEMO_HTTP_PORT" not in text and "SAPO_DEMO_NODE_ID" in text  # no flag gave the node id


def test_sasl_needs_credentials_and_secrets_are_masked() -> None:
    with pytest.raises(ValueError, match="SASL_USERNAME"):
        KafkaConnection(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512")
    conn = KafkaConnection(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="hunter2",
    )
    assert conn.to_librdkafka()["sasl.password"] == "hunter2"
    s = DemoSettings(node_id="n", kafka=conn, identity={"private_key": "topsecret"})
    dumped = str(describe(s))
    assert "hunter2" not in dumped
    assert "topsecret" not in dumped


def test_errors_never_echo_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__SASL_PASSWORD", "hunter2")
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings)
    assert "SAPO_DEMO_KAFKA: " in str(info.value)
    assert "given: sasl_password, security_protocol" in str(info.value)
    assert "hunter2" not in str(info.value)
    monkeypatch.setenv("SAPO_DEMO_KAFKA__SASL_PASSWORD", "")
    with pytest.raises(ConfigError) as info:
        load_settings(DemoSettings, kafka={"sasl_password": ["hunter2"]}, http_port="x")
    assert "SAPO_DEMO_KAFKA__SASL_PASSWORD: " in str(info.value)
    assert "(a secret, not shown)" in str(info.value)
    assert "SAPO_DEMO_HTTP_PORT: " in str(info.value) and "got 'x'" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_misspelled_variable_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "h:1")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PROT", "9000")
    monkeypatch.setenv("SAPO_DEMO_XYZ", "1")
    with pytest.raises(ConfigError, match="SAPO_DEMO_HTTP_PROT") as error:
        load_settings(DemoSettings)
    lines = str(error.value).splitlines()
    assert "  SAPO_DEMO_HTTP_PROT: did you mean SAPO_DEMO_HTTP_PORT?" in lines
    assert not any(line.startswith("  SAPO_DEMO_XYZ") for line in lines)  # nothing close: no guess
    assert lines[-1].startswith("known: ") and "SAPO_DEMO_HTTP_PORT" in lines[-1]


def test_watching_consumers_fetch_at_their_own_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams no round waits on (leases, the trainer's announcements) poll the broker less often."""
    local = ConsumerProfile.local()
    assert local.to_librdkafka()["fetch.wait.max.ms"] == "50"
    assert local.to_librdkafka(watch=True)["fetch.wait.max.ms"] == "500"
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "node-7")
    monkeypatch.setenv("SAPO_DEMO_CONSUMER__WATCH_FETCH_WAIT_MAX_MS", "1500")
    s = load_settings(DemoSettings)
    assert s.consumer.to_librdkafka(watch=True)["fetch.wait.max.ms"] == "1500"
    assert s.consumer.to_librdkafka()["fetch.wait.max.ms"] == "500"  # the others keep theirs
    monkeypatch.setenv("SAPO_DEMO_CONSUMER__WATCH_FETCH_WAIT_MAX_MS", "0")
    with pytest.raises(ConfigError, match=r"WATCH_FETCH_WAIT_MAX_MS|watch_fetch_wait_max_ms"):
        load_settings(DemoSettings)


def test_an_ops_port_in_use_fails_the_start_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("SAPO_DEMO_HTTP_HOST", "127.0.0.1")
        monkeypatch.setenv("SAPO_DEMO_HTTP_PORT", str(port))
        settings = load_settings(DemoSettings)
        with pytest.raises(ConfigError) as error:
            open_ops_server(settings, CollectorRegistry(), Health())
    message = str(error.value)
    assert message.startswith(f"SAPO_DEMO_HTTP_PORT={port}: cannot listen on 127.0.0.1:{port}")
    assert "0 picks one" in message and "SAPO_DEMO_HTTP_HOST" in message


def test_log_level_in_either_case_and_a_list_given_as_plain_text_says_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "n")
    monkeypatch.setenv("SAPO_SAMPLER_LOG_LEVEL", "debug")
    assert load_settings(SamplerSettings).log_level == "DEBUG"
    monkeypatch.setenv("SAPO_SAMPLER_ACCEPTED_TASKS", "calendar_arithmetic")
    with pytest.raises(ConfigError) as error:
        load_settings(SamplerSettings)
    assert "SAPO_SAMPLER_ACCEPTED_TASKS" in str(error.value)
    assert 'a variable holding a list is JSON, e.g. ["a", "b"]' in str(error.value)
    monkeypatch.setenv("SAPO_SAMPLER_ACCEPTED_TASKS", '["calendar_arithmetic"]')
    assert load_settings(SamplerSettings).accepted_tasks == frozenset({"calendar_arithmetic"})


def test_field_bounds_are_the_declared_ones() -> None:
    fields = SamplerSettings.model_fields
    assert field_bounds(fields["local_groups"]) == {"ge": 0, "le": 256}
    assert field_bounds(fields["lockstep_timeout_s"]) == {"gt": 0, "le": 86_400}
    assert field_bounds(fields["node_id"]) == {}


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "localhost:99999", "the port '99999' is not a number from 1"),
        ("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "", "it names no broker"),
        ("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", ",", "it names no broker"),
        ("SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS", "swarm:0", "the port '0' is not a number from 1"),
        ("SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS", "http://swarm:9092", "the scheme http:// is none of"),
    ],
)
def test_a_broker_list_of_the_wrong_form_fails_the_start_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, reason: str
) -> None:
    """librdkafka would take port 99999 as 34463, and drop what it cannot parse: a transport failure
    that never ends instead of one line at start."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_settings(DemoSettings)
    lines = str(error.value).splitlines()
    assert lines[0] == "invalid configuration for DemoSettings:"
    assert lines[1].startswith(f"  {variable}: Value error, must name the brokers as HOST:PORT")
    assert reason in lines[1] and lines[1].endswith(f"(got {value!r})")


def test_a_service_takes_broker_names_that_do_not_resolve_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the form is checked at start: a cluster's DNS may answer later (a command looks its names
    up before it connects, `check_command_brokers`)."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "kafka-0.not-yet.invalid:9092,[::1]:9093")
    monkeypatch.setenv("SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS", "SASL_SSL://swarm.not-yet.invalid:9093")
    monkeypatch.setenv("SAPO_DEMO_SWARM_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SAPO_DEMO_SWARM_KAFKA__SASL_MECHANISM", "OAUTHBEARER")
    settings = load_settings(DemoSettings)
    assert settings.kafka.bootstrap_servers == "kafka-0.not-yet.invalid:9092,[::1]:9093"
    assert (
        settings.swarm_connection.to_librdkafka()["bootstrap.servers"]
        == "SASL_SSL://swarm.not-yet.invalid:9093"
    )


def test_the_brokers_are_named_by_bootstrap_servers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheme librdkafka drops (not the security protocol), or brokers in `extra` that no check sees."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "SSL://b:9093")
    mismatch = (
        "SAPO_DEMO_KAFKA__SECURITY_PROTOCOL: Value error, KAFKA__BOOTSTRAP_SERVERS names the scheme SSL:// "
        "but "
    )
    with pytest.raises(ConfigError, match=mismatch + "security_protocol is PLAINTEXT"):
        load_settings(DemoSettings)
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "ssl://b:9093")  # either case, as librdkafka
    monkeypatch.setenv("SAPO_DEMO_KAFKA__SECURITY_PROTOCOL", "SSL")
    assert load_settings(DemoSettings).kafka.bootstrap_servers == "ssl://b:9093"
    monkeypatch.setenv("SAPO_DEMO_KAFKA__EXTRA", '{"bootstrap.servers": "other:9092"}')
    with pytest.raises(ConfigError, match=r"SAPO_DEMO_KAFKA__EXTRA: Value error, bootstrap\.servers is the"):
        load_settings(DemoSettings)


@pytest.mark.parametrize(
    ("variable", "value", "hint"),
    [
        ("SAPO_SAMPLER_ACCEPTED_PROFILES", "easy", 'a variable holding a list is JSON, e.g. ["a", "b"]'),
        ("SAPO_SAMPLER_ACCEPTED_CONFIG_DIGESTS", "", 'a variable holding a list is JSON, e.g. ["a", "b"]'),
        (
            "SAPO_SAMPLER_KAFKA__EXTRA",
            "linger.ms=5",
            'a variable holding a mapping is JSON, e.g. {"key": "value"}',
        ),
        ("SAPO_SAMPLER_KAFKA", '{"sasl_password": "hunter2"', "SAPO_SAMPLER_KAFKA__<FIELD>"),
        ("SAPO_SAMPLER_WARM_START", "enabled", "SAPO_SAMPLER_WARM_START__<FIELD>"),
    ],
)
def test_a_variable_that_is_not_the_json_its_setting_needs_names_it_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, hint: str
) -> None:
    """pydantic-settings decodes a collection or nested model from JSON before validation and raises its
    own SettingsError (a traceback at start) when that fails: it must read as every other bad value."""
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "n")
    monkeypatch.setenv("SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS", "b:9092")  # text, not JSON, and fine
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        load_settings(SamplerSettings)
    message = str(error.value)
    assert f"  {variable}: not valid JSON" in message
    assert "BOOTSTRAP_SERVERS" not in message
    assert hint in message
    assert "hunter2" not in message  # a nested model's text may hold a secret: never shown


@pytest.mark.parametrize(
    ("variables", "named", "said"),
    [
        ({"KAFKA__EXTRA": '{"no.such.property": "1"}'}, "SAPO_DEMO_KAFKA", "No such configuration property"),
        ({"KAFKA__EXTRA": '{"linger.ms": "soon"}'}, "SAPO_DEMO_KAFKA", "Invalid value"),
        (
            {"KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA__SASL_MECHANISM": "NOPE"},
            "SAPO_DEMO_KAFKA",
            "Unsupported SASL mechanism",
        ),
        (
            {"SWARM_KAFKA__SECURITY_PROTOCOL": "SSL", "SWARM_KAFKA__SSL_CA_LOCATION": "/no/such/ca.pem"},
            "SAPO_DEMO_SWARM_KAFKA",
            "ssl.ca.location",
        ),
    ],
)
def test_client_settings_librdkafka_refuses_fail_the_start_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], named: str, said: str
) -> None:
    """librdkafka checks its properties (extra ones, SASL mechanisms, TLS files) only when a client is
    created: that must read as a configuration error, not a KafkaException traceback."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    for name, value in variables.items():
        monkeypatch.setenv(f"SAPO_DEMO_{name}", value)
    settings = load_settings(DemoSettings)
    swarm = named.endswith("SWARM_KAFKA")
    with pytest.raises(ConfigError) as error:
        open_publisher(settings, TransportMetrics(CollectorRegistry(), "demo"), StopFlag(), swarm=swarm)
    message = str(error.value)
    assert message.startswith(f"{named}__*: ") and said in message


@pytest.mark.parametrize("path", ["", "/", "/no/such/directory/port", "{tmp}"])
def test_a_port_file_that_cannot_be_written_fails_the_start_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: str
) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PORT_FILE", path.format(tmp=tmp_path))  # {tmp}: a directory
    settings = load_settings(DemoSettings)
    with pytest.raises(ConfigError) as error:
        write_port_file(settings, 8080)
    message = str(error.value)
    assert message.startswith("SAPO_DEMO_HTTP_PORT_FILE=") and "cannot write the bound port" in message


def test_the_port_file_holds_the_bound_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PORT_FILE", str(tmp_path / "port"))
    write_port_file(load_settings(DemoSettings), 8123)
    assert (tmp_path / "port").read_text() == "8123"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["port"]


def test_a_refused_client_setting_ends_the_start_before_the_port_file_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The file used to stay behind naming a port nothing served, which a supervisor then polled."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PORT", "0")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PORT_FILE", str(tmp_path / "port"))
    monkeypatch.setenv("SAPO_DEMO_KAFKA__EXTRA", '{"no.such.property": "1"}')
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with pytest.raises(ConfigError, match=r"^SAPO_DEMO_KAFKA__\*: "):
            start_runtime("demo", load_settings(DemoSettings), install_signals=False)
    finally:
        root.handlers[:], root.level = handlers, level  # keep pytest's log capture
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [" ", "\t", ",", " , "])
def test_bootstrap_servers_that_name_no_broker_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """librdkafka takes a blank list as no broker at all, warns once and never connects."""
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS", value)
    with pytest.raises(ConfigError, match=r"SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS: .*names no broker"):
        load_settings(DemoSettings)
    monkeypatch.setenv("SAPO_DEMO_SWARM_KAFKA__BOOTSTRAP_SERVERS", "b1:9092, b2:9092,")
    assert load_settings(DemoSettings).swarm_connection.bootstrap_servers == "b1:9092, b2:9092,"


def test_a_misspelled_nested_variable_names_the_field_it_likely_means(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "Extra inputs are not permitted" said neither what was meant nor what the model takes."""
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "n")
    monkeypatch.setenv("SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVER", "b:9092")
    monkeypatch.setenv("SAPO_SAMPLER_WARM_START__XYZ", "1")
    with pytest.raises(ConfigError) as error:
        load_settings(SamplerSettings)
    lines = str(error.value).splitlines()
    assert any(
        line.startswith("  SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVER: Extra inputs are not permitted")
        and line.endswith("did you mean SAPO_SAMPLER_KAFKA__BOOTSTRAP_SERVERS?")
        for line in lines
    )
    assert any(
        line.startswith("  SAPO_SAMPLER_WARM_START__XYZ: ")
        and line.endswith("SAPO_SAMPLER_WARM_START__ takes: ENABLED, MAX_AGE_S, MAX_GROUPS, MAX_BATCHES")
        for line in lines
    )


def test_a_misspelled_nested_secret_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable no field takes may be a misspelled password: its value is never shown."""
    monkeypatch.setenv("SAPO_SAMPLER_NODE_ID", "n")
    monkeypatch.setenv("SAPO_SAMPLER_KAFKA__SASL_PASSWROD", "hunter2")
    with pytest.raises(ConfigError) as error:
        load_settings(SamplerSettings)
    assert "SAPO_SAMPLER_KAFKA__SASL_PASSWROD: Extra inputs are not permitted" in str(error.value)
    assert "did you mean SAPO_SAMPLER_KAFKA__SASL_PASSWORD?" in str(error.value)
    assert "hunter2" not in str(error.value)
