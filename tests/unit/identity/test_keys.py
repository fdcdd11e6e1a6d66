"""Node keys: ids, text forms, files with safe permissions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sapo.identity.keys import (
    IdentityError,
    NodeKey,
    key_id,
    parse_private,
    parse_public,
    public_text,
    read_private,
    write_private,
)

pytestmark = pytest.mark.unit


def test_key_id_is_a_stable_hash_of_the_public_key() -> None:
    key = NodeKey.generate()
    assert key.key_id == key_id(key.public) == key_id(parse_public(key.public_text))
    assert len(key.key_id) == 32 and int(key.key_id, 16) >= 0
    assert NodeKey.generate().key_id != key.key_id


def test_public_text_round_trip() -> None:
    key = NodeKey.generate()
    assert key.public_text.startswith("ed25519:")
    assert public_text(parse_public(key.public_text)) == key.public_text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rsa:AAAA", "must start with 'ed25519:'"),
        ("ed25519:not base64!", "not valid base64"),
        ("ed25519:AAAA", "32 bytes, got 3"),
    ],
)
def test_bad_public_keys_say_why(text: str, message: str) -> None:
    with pytest.raises(IdentityError, match=message):
        parse_public(text)


def test_private_key_file_is_owner_only_and_never_overwritten(tmp_path: Path) -> None:
    key = NodeKey.generate()
    path = tmp_path / "node.key"
    write_private(path, key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert read_private(path).key_id == key.key_id
    with pytest.raises(IdentityError, match="exists"):
        write_private(path, NodeKey.generate())
    assert read_private(path).key_id == key.key_id


def test_unreadable_or_foreign_private_keys_say_why(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot read private key"):
        read_private(tmp_path / "missing.key")
    with pytest.raises(IdentityError, match="not an unencrypted PEM private key"):
        parse_private(b"hello", "inline")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        parse_private(pem, "ec.key")
