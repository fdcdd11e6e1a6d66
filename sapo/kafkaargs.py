"""The Kafka connection flags of the `sapo` commands that reach a cluster (`inspect`, `conformance`,
`topics`, `keys announce|revoke`): `--bootstrap`, `--security-protocol`, `--sasl-*`, `--ssl-*` and
`-X KEY=VALUE`, over the typed `KafkaConnection` (field `kafka`) that the command's settings read from
its `SAPO_<COMMAND>_KAFKA__*` variables. The secrets (SASL password, TLS key password) come only from
the environment or from files named by flags, so they never appear in a process list; they are never
printed. Everything is checked before any Kafka client starts, and a bad value is named by the flag
that gave it, else by its variable."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic_settings import BaseSettings

from sapo.cliargs import bootstrap_servers
from sapo.settings import (
    ConfigError,
    SecurityProtocol,
    check_command_brokers,
    env_prefix,
    env_source,
    load_settings,
)

S = TypeVar("S", bound=BaseSettings)


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: use KEY=VALUE (a librdkafka property)")
    return key, value


def add_connection_arguments(parser: argparse.ArgumentParser, env: str) -> argparse._ArgumentGroup:
    """The Kafka connection flags: they override the typed `KafkaConnection` read from the `env`
    variables; `kafka_overrides` turns them into its fields. The group is returned for the command's
    own connection-related flags (`--prefix`)."""
    conn = parser.add_argument_group(f"connection (overrides {env})")
    conn.add_argument("--bootstrap", type=bootstrap_servers, help="bootstrap.servers (HOST:PORT[,...])")
    conn.add_argument("--security-protocol", choices=[p.value for p in SecurityProtocol])
    conn.add_argument("--sasl-mechanism", help="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER")
    conn.add_argument("--sasl-username")
    conn.add_argument("--sasl-password-file", type=Path, help="file holding the SASL password")
    conn.add_argument("--ssl-ca-location", help="CA bundle that signed the brokers")
    conn.add_argument("--ssl-certificate-location", help="client certificate (mutual TLS)")
    conn.add_argument("--ssl-key-location", help="client private key (mutual TLS)")
    conn.add_argument("--ssl-key-password-file", type=Path, help="file holding the client key's password")
    conn.add_argument(
        "-X", dest="properties", action="append", type=_property, default=[], metavar="KEY=VALUE",
        help="any other librdkafka property (repeatable)",
    )  # fmt: skip
    return conn


_CONNECTION_FLAGS: Final = {
    "bootstrap_servers": ("bootstrap", "--bootstrap"),
    "security_protocol": ("security_protocol", "--security-protocol"),
    "sasl_mechanism": ("sasl_mechanism", "--sasl-mechanism"),
    "sasl_username": ("sasl_username", "--sasl-username"),
    "sasl_password": ("sasl_password_file", "--sasl-password-file"),
    "ssl_ca_location": ("ssl_ca_location", "--ssl-ca-location"),
    "ssl_certificate_location": ("ssl_certificate_location", "--ssl-certificate-location"),
    "ssl_key_location": ("ssl_key_location", "--ssl-key-location"),
    "ssl_key_password": ("ssl_key_password_file", "--ssl-key-password-file"),
    "extra": ("properties", "-X"),
}
"""The `KafkaConnection` fields the connection flags set: field -> (argparse dest, flag)."""


def _flags_given(args: argparse.Namespace) -> dict[str, tuple[Any, str]]:
    """field -> (value, flag) of each connection flag given (-X: once or more)."""
    flags = {field: (getattr(args, dest), flag) for field, (dest, flag) in _CONNECTION_FLAGS.items()}
    return {field: pair for field, pair in flags.items() if pair[0] is not None and pair[0] != []}


def _read_secret(path: Path | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror}") from None


def kafka_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `KafkaConnection` fields the connection flags set (secrets read from their files)."""
    overrides: dict[str, Any] = {}
    for field, (value, flag) in _flags_given(args).items():
        if field in ("sasl_password", "ssl_key_password"):
            overrides[field] = _read_secret(value, flag)
        else:
            overrides[field] = dict(value) if field == "extra" else value
    return overrides


def kafka_flags(args: argparse.Namespace) -> dict[str, str]:
    """The flag that gave each `KafkaConnection` field the flags set (`kafka.bootstrap_servers` ->
    `--bootstrap`), for `load_settings` and `check_command_brokers` to name it."""
    return {f"kafka.{field}": flag for field, (_, flag) in _flags_given(args).items()}


def load_connection_settings(
    cls: type[S], args: argparse.Namespace, given: Mapping[str, str], /, **overrides: Any
) -> S:
    """`load_settings` of a command's settings with the connection flags over the environment, then the
    brokers it will use checked as `--bootstrap` checks its value (`check_command_brokers`), whether the
    flag or the environment gave them: before any Kafka client starts. `given` names the other fields
    a flag gave."""
    flags = kafka_flags(args) | dict(given)
    settings = load_settings(cls, flags, kafka=kafka_overrides(args), **overrides)
    check_command_brokers(settings, flags)
    return settings


def brokers_source(cls: type[BaseSettings], args: argparse.Namespace) -> str:
    """What gave the brokers of `cls`'s `kafka` connection, for a failure to reach them to name what to
    change: `--bootstrap`, the variable by its exact name, or the default's variable."""
    loc = ("kafka", "bootstrap_servers")
    return (
        kafka_flags(args).get(".".join(loc))
        or env_source(cls, loc, os.environ)
        or f"--bootstrap or {env_prefix(cls)}KAFKA__BOOTSTRAP_SERVERS (unset: the default)"
    )
