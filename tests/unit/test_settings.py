"""Settings: env parsing, actionable validation errors, secrets masked, librdkafka edge dict."""

from __future__ import annotations

import pytest
from pydantic_settings import SettingsConfigDict

from sapo.settings import ConfigError, KafkaConnection, ServiceSettings, describe, load_settings

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


def test_misspelled_variable_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_DEMO_NODE_ID", "n")
    monkeypatch.setenv("SAPO_DEMO_KAFKA__BOOTSTRAP_SERVERS", "h:1")
    monkeypatch.setenv("SAPO_DEMO_HTTP_PROT", "9000")
    with pytest.raises(ConfigError, match="SAPO_DEMO_HTTP_PROT"):
        load_settings(DemoSettings)
