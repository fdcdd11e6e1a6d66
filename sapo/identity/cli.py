"""`sapo keys`: node key pairs, trust list files and key announcements.

    sapo keys generate keys/node-0.key            # key pair (0600 private key, .pub beside it)
    sapo keys show keys/node-0.key                # key id and public key
    sapo keys trust trust.yaml --node node-0 --key keys/node-0.key.pub  # add a node's key
    sapo keys trust trust.yaml --admin keys/admin.key.pub               # add a swarm admin key
    sapo keys trust trust.yaml --remove KEY_ID [--revoke]               # retire or revoke a key
    sapo keys announce --bootstrap HOST:PORT --node node-0 --key new.key --previous old.key --overlap 3600
    sapo keys announce --bootstrap HOST:PORT --node node-9 --public-key node-9.key.pub --admin-key admin.key
    sapo keys revoke --bootstrap HOST:PORT --node node-0 --key-id KEY_ID --signer old.key

`announce` and `revoke` reach the cluster as configured by `SAPO_KEYS_KAFKA__*` (as for the services:
`BOOTSTRAP_SERVERS`, `SECURITY_PROTOCOL`, `SASL_*`, `SSL_*`), overridden by the connection flags; the
SASL password and the TLS key password only from the environment or a file:

    SAPO_KEYS_KAFKA__SASL_PASSWORD=... sapo keys announce --bootstrap HOST:9096 \\
        --security-protocol SASL_SSL --sasl-mechanism SCRAM-SHA-512 --sasl-username node-0 ...

Results go to stdout as `name=value` lines, diagnostics to stderr; exit status 1 on any refusal.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sapo.cliargs import positive_seconds, topic_prefix
from sapo.identity.announce import add_statement, announcement, record_key, revoke_statement
from sapo.identity.keys import (
    KEY_ID_RE,
    PUBLIC_PREFIX,
    IdentityError,
    NodeKey,
    key_id,
    parse_public,
    public_text,
    read_private,
    write_private,
    write_public,
)
from sapo.identity.trustlist import TrustList, load_trust_list, save_trust_list
from sapo.kafkaargs import add_connection_arguments, brokers_source, load_connection_settings
from sapo.settings import KafkaConnection
from sapo.topics import DEFAULT_PREFIX, TopicNames, validate_node_id
from sapo.v1 import identity_pb2

log = logging.getLogger("sapo.cli")


def _node_id(value: str) -> str:
    try:
        return validate_node_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _key_id(value: str) -> str:
    if not KEY_ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a key id (32 lower-case hex characters)")
    return value


def _new_key_path(value: str) -> Path:
    """`keys generate PATH`: a path that names a file (its public half goes beside it as PATH.pub)."""
    path = Path(value)
    if not path.name:
        raise argparse.ArgumentTypeError(f"{value!r} names no file: give the private key file to create")
    return path


MAX_OVERLAP_S = 100 * 365 * 86_400
"""The longest rotation overlap: a retirement time beyond it left the protobuf Timestamp's range (a
traceback), and no key pair is meant to outlive it."""


def _overlap(value: str) -> float:
    """`--overlap`: seconds, finite and at most a century (a negative one means none, as ever)."""
    seconds = float(value)
    if not math.isfinite(seconds) or seconds > MAX_OVERLAP_S:
        raise argparse.ArgumentTypeError(f"must be a number of seconds <= {MAX_OVERLAP_S}, got {value}")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    gen = sub.add_parser("generate", help="write a new key pair (PATH mode 0600, PATH.pub)")
    gen.add_argument("path", type=_new_key_path, help="private key file to create (never overwritten)")
    gen.set_defaults(keys_run=_generate)

    show = sub.add_parser("show", help="print the key id and public key of a key file or public key")
    show.add_argument("key", help="private key file, .pub file or ed25519:... text")
    show.set_defaults(keys_run=_show)

    trust = sub.add_parser("trust", help="create or change a trust list file")
    trust.add_argument("file", type=Path, help="trust list (YAML); created when missing")
    trust.add_argument("--node", type=_node_id, help="node id the --key belongs to")
    trust.add_argument("--key", help="public key to add for --node (file or ed25519:... text)")
    trust.add_argument("--admin", help="public key to add as a swarm admin (file or text)")
    trust.add_argument("--remove", type=_key_id, help="key id to remove from its node")
    trust.add_argument("--revoke", action="store_true", help="with --remove: also never accept it again")
    trust.set_defaults(keys_run=_trust)

    ann = sub.add_parser("announce", help="publish a signed key announcement to <prefix>.swarm.keys")
    _add_kafka_arguments(ann)
    ann.add_argument("--node", type=_node_id, required=True, help="node the key belongs to")
    announced = ann.add_mutually_exclusive_group(required=True)
    announced.add_argument("--key", type=Path, help="the announced key's private key file (it signs)")
    announced.add_argument(
        "--public-key",
        help="admission: the node's public key (.pub file or text), vouched for by --admin-key",
    )
    ann.add_argument("--previous", type=Path, help="rotation: the node's current private key (signs)")
    ann.add_argument(
        "--overlap",
        type=_overlap,
        default=3600.0,
        help="rotation: seconds both keys stay valid (default 3600)",
    )
    ann.add_argument("--admin-key", type=Path, help="admission: a swarm admin's private key (signs)")
    ann.set_defaults(keys_run=_announce)

    rev = sub.add_parser("revoke", help="publish a signed revocation to <prefix>.swarm.keys")
    _add_kafka_arguments(rev)
    rev.add_argument("--node", type=_node_id, required=True, help="node the key belongs to")
    rev.add_argument("--key-id", type=_key_id, required=True, help="the key to revoke")
    rev.add_argument("--signer", type=Path, required=True, help="the revoked key itself, or an admin key")
    rev.set_defaults(keys_run=_revoke)


class KeysSettings(BaseSettings):
    """The swarm cluster `sapo keys announce|revoke` publishes to (`SAPO_KEYS_KAFKA__*`)."""

    model_config = SettingsConfigDict(
        env_prefix="SAPO_KEYS_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    kafka: KafkaConnection = Field(default_factory=KafkaConnection, description="The swarm cluster.")


def _add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    conn = add_connection_arguments(parser, "SAPO_KEYS_KAFKA__*")
    conn.add_argument(
        "--prefix", type=topic_prefix, default=DEFAULT_PREFIX, help="topic prefix (default: %(default)s)"
    )
    parser.add_argument("--timeout", type=positive_seconds, default=30.0, help="seconds to wait for the ack")


Publish = Callable[[dict[str, str], str, bytes, bytes, float], tuple[int, int]]
"""(librdkafka config, topic, key, value, timeout_s) -> (partition, offset) once the broker
acknowledged; raises RuntimeError otherwise. `sapo.cli` passes one over the project's Kafka producer
(the identity library sits below the Kafka layer)."""


def run(args: argparse.Namespace, publish: Publish) -> int:
    try:
        code: int = args.keys_run(args, publish)
    except IdentityError as exc:
        log.error("%s", exc)
        return 1
    return code


def _generate(args: argparse.Namespace, _publish: Publish) -> int:
    key = NodeKey.generate()
    public_path = args.path.with_name(args.path.name + ".pub")
    if public_path.exists():  # another key's public half: replacing it would orphan that key's trust
        raise IdentityError(f"{public_path} exists; remove it first or choose another path")
    write_private(args.path, key)
    write_public(public_path, key)
    print(f"private_key={args.path}\npublic_key_file={public_path}")
    _print_key(key.key_id, key.public_text)
    return 0


def _print_key(kid: str, public: str) -> None:
    print(f"key_id={kid}\npublic_key={public}")


def _public_of(text: str) -> str:
    """`ed25519:...` text from itself, a .pub file or a private key file."""
    if text.startswith(PUBLIC_PREFIX):
        return public_text(parse_public(text))
    path = Path(text)
    try:
        content = path.read_text().strip()
    except OSError as exc:
        raise IdentityError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise IdentityError(f"{path} is neither a key file nor ed25519:... text") from None
    if content.startswith(PUBLIC_PREFIX):
        return public_text(parse_public(content))
    return read_private(path).public_text


def _show(args: argparse.Namespace, _publish: Publish) -> int:
    public = _public_of(args.key)
    _print_key(key_id(parse_public(public)), public)
    return 0


def _trust(args: argparse.Namespace, _publish: Publish) -> int:
    trust = load_trust_list(args.file) if args.file.exists() else TrustList()
    if (args.node is None) != (args.key is None):
        raise IdentityError("--node and --key go together")
    if args.revoke and args.remove is None:
        raise IdentityError("--revoke needs --remove KEY_ID")
    if args.key is not None:
        trust = trust.with_key(args.node, _public_of(args.key))
    if args.admin is not None:
        trust = trust.with_admin(_public_of(args.admin))
    if args.remove is not None:
        kept = trust.without_key(args.remove, revoke=args.revoke)
        if kept.nodes == trust.nodes and not args.revoke:  # revoking a key never trusted is allowed
            raise IdentityError(f"no node in {args.file} has key {args.remove}; nothing removed")
        trust = kept
    save_trust_list(args.file, trust)
    print(f"trust_file={args.file}\nnodes={len(trust.nodes)}\nadmins={len(trust.admins)}")
    return 0


def _announce(args: argparse.Namespace, publish: Publish) -> int:
    settings = load_connection_settings(KeysSettings, args, {})  # before any key file is read
    signers = [read_private(args.key)] if args.key is not None else []
    public = signers[0].public if signers else parse_public(_public_of(args.public_key))
    if args.public_key is not None and (args.admin_key is None or args.previous is not None):
        raise IdentityError("--public-key admits a node: it needs --admin-key, and a rotation needs --key")
    previous_id = ""
    if args.previous is not None:
        previous = read_private(args.previous)
        if previous.key_id == key_id(public):
            raise IdentityError("--previous is the same key as --key")
        signers.append(previous)
        previous_id = previous.key_id
    if args.admin_key is not None:
        signers.append(read_private(args.admin_key))
    statement = add_statement(
        args.node, public, time.time(), previous_key_id=previous_id, overlap_s=max(0.0, args.overlap)
    )
    return _publish(args, publish, settings, statement, signers)


def _revoke(args: argparse.Namespace, publish: Publish) -> int:
    settings = load_connection_settings(KeysSettings, args, {})
    signer = read_private(args.signer)
    statement = revoke_statement(args.node, args.key_id, time.time(), signer)
    return _publish(args, publish, settings, statement, [signer])


def _publish(
    args: argparse.Namespace,
    publish: Publish,
    settings: KeysSettings,
    statement: identity_pb2.KeyStatement,
    signers: list[NodeKey],
) -> int:
    topic = TopicNames.for_node(statement.node_id, args.prefix).swarm_keys
    value = announcement(statement, signers)
    config = settings.kafka.to_librdkafka()
    try:
        partition, offset = publish(config, topic, record_key(statement), value, args.timeout)
    except RuntimeError as exc:
        log.error(
            "%s: check that %s (%s) reaches the cluster, that the security settings (--security-protocol, "
            "--sasl-*, --ssl-* or SAPO_KEYS_KAFKA__*) match its listener, and that %s exists (`sapo topics`)",
            exc,
            brokers_source(KeysSettings, args),
            settings.kafka.bootstrap_servers,
            topic,
        )
        return 1
    print(f"topic={topic}\npartition={partition}\noffset={offset}")
    print(f"node={statement.node_id}\nkey_id={statement.key_id}")
    return 0
