"""A node's Ed25519 key pair: generation, files, the public key's text form and its key id.

Ed25519 through `cryptography` (the Python Cryptographic Authority's OpenSSL binding, the library
pip, TLS stacks and cloud SDKs rely on): small keys and signatures (32 and 64 bytes, cheap in a
Kafka header), deterministic signing with no nonce to get wrong, and verification in tens of
microseconds.

Formats, chosen so that standard tools read them:
- private key: PEM, PKCS#8, unencrypted (`openssl pkey -in node.key -pubout` works); written with
  mode 0600 and never over an existing file. On Kubernetes it is a Secret mounted as a file.
- public key: `ed25519:<base64 of the 32 raw bytes>` (trust lists, CLI output, headers).
- key id: the first 16 bytes of sha256(raw public key), lower-case hex (32 characters). It names a
  key in headers and announcements; 128 bits keep a deliberate collision out of reach.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_PREFIX: Final = "ed25519:"
RAW_KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64
KEY_ID_RE: Final = re.compile(r"^[0-9a-f]{32}$")


class IdentityError(ValueError):
    """A key or trust list that cannot be read or used; the message says which file or text and why."""


def key_id(public: Ed25519PublicKey) -> str:
    """The key's id: hex of the first 16 bytes of sha256 over its 32 raw bytes."""
    return hashlib.sha256(public.public_bytes_raw()).hexdigest()[:32]


def public_text(public: Ed25519PublicKey) -> str:
    """`ed25519:<base64>`: the form trust lists and the CLI use."""
    return PUBLIC_PREFIX + base64.b64encode(public.public_bytes_raw()).decode()


def public_from_raw(raw: bytes) -> Ed25519PublicKey:
    if len(raw) != RAW_KEY_BYTES:
        raise IdentityError(f"an Ed25519 public key is {RAW_KEY_BYTES} bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def parse_public(text: str) -> Ed25519PublicKey:
    """A public key from its `ed25519:<base64>` text; raises IdentityError saying what is wrong."""
    text = text.strip()
    if not text.startswith(PUBLIC_PREFIX):
        raise IdentityError(f"public key {text[:24]!r}... must start with {PUBLIC_PREFIX!r}")
    try:
        raw = base64.b64decode(text[len(PUBLIC_PREFIX) :], validate=True)
    except binascii.Error:
        raise IdentityError(f"public key {text[:24]!r}... is not valid base64") from None
    return public_from_raw(raw)


@dataclass(frozen=True)
class NodeKey:
    """A node's private key with its public half and key id (computed once)."""

    private: Ed25519PrivateKey
    public: Ed25519PublicKey
    key_id: str

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> NodeKey:
        public = private.public_key()
        return cls(private, public, key_id(public))

    @classmethod
    def generate(cls) -> NodeKey:
        return cls.of(Ed25519PrivateKey.generate())

    @property
    def public_text(self) -> str:
        return public_text(self.public)

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    def pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def parse_private(pem: bytes, source: str) -> NodeKey:
    """A node key from PEM (PKCS#8) bytes; `source` names where they came from in errors."""
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"{source}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise IdentityError(f"{source}: a {type(private).__name__}, not an Ed25519 key")
    return NodeKey.of(private)


def read_private(path: Path) -> NodeKey:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise IdentityError(f"cannot read private key {path}: {exc.strerror}") from None
    return parse_private(pem, str(path))


def write_private(path: Path, key: NodeKey) -> None:
    """Write the key readable by its owner only; refuse to replace an existing file (a lost node key
    means a rotation, which is an operator's decision, not a side effect)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise IdentityError(f"{path} exists; remove it first or choose another path") from None
    except OSError as exc:
        raise IdentityError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(key.pem())


def write_public(path: Path, key: NodeKey) -> None:
    path.write_text(key.public_text + "\n")
