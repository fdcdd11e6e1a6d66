"""What a signature covers: a message's payload together with the headers filters trust.

A shared group carries four more headers: `sapo-key-id`, `sapo-public-key` (so an open swarm can pin
a node's first key from its first group), `sapo-signature` and `sapo-signature-v2`, two Ed25519
signatures over `signed_bytes(headers, value)` and `signed_bytes(headers, value, facts=True)`:

    b"sapo-signed-message/v1\\0"   (v2: b"sapo-signed-message/v2\\0")
    then for each of sapo-type, sapo-node-id, sapo-task, sapo-schema-version, sapo-key-id
    (v2: sapo-type, sapo-node-id, sapo-task, sapo-schema-version, sapo-group-facts, sapo-key-id):
        name, b"\\0", 4-byte big-endian length of the header's value, the value (empty if absent)
    then b"sha256\\0" and the 32-byte SHA-256 digest of the payload.

Every field is length-prefixed in a fixed order, so no two header sets give the same bytes; an absent
header is signed as empty, so one cannot be added later. Swapping signed headers onto another body, or
editing a routing header (the node id that quotas key on, the task or schema version a prefilter
reads), breaks the signature. The type header keeps a signed group from being replayed as another
message type. Key statements (`sapo.identity.announce`) sign under their own domain tag, so no
signature is valid in both places.

The v2 signature also covers the facts header: a lazy sampler pools a group and counts its lock-step
arrival on the facts (id, round, date, claimed signal) before it decodes the body, so facts that only
v1 covers would let anyone replay a node's signed group as other groups of that node. A receiver
verifies v2 when the record has it and then trusts the facts (`Sender.facts_signed`); a record with v1
alone (an older signer, or a copy whose v2 header was stripped) is verified by v1, and its facts are
not trusted: the body is decoded on arrival and the facts header set aside. Signers write both, so
receivers that predate v2 verify v1 as before: compatible both ways.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sapo.identity.keys import SIGNATURE_BYTES, NodeKey
from sapo.wire import H_FACTS, H_NODE, H_SCHEMA, H_TASK, H_TYPE

H_KEY_ID: Final = "sapo-key-id"
H_PUBLIC_KEY: Final = "sapo-public-key"
H_SIGNATURE: Final = "sapo-signature"
H_SIGNATURE_V2: Final = "sapo-signature-v2"
"""The signature that covers the facts header too (module docstring)."""

MESSAGE_DOMAIN: Final = b"sapo-signed-message/v1\x00"
MESSAGE_DOMAIN_V2: Final = b"sapo-signed-message/v2\x00"
STATEMENT_DOMAIN: Final = b"sapo-key-statement/v1\x00"
SIGNED_HEADERS: Final = (H_TYPE, H_NODE, H_TASK, H_SCHEMA, H_KEY_ID)
"""The headers a v1 signature binds, in the order they are signed."""
SIGNED_HEADERS_V2: Final = (H_TYPE, H_NODE, H_TASK, H_SCHEMA, H_FACTS, H_KEY_ID)
"""The headers a v2 signature binds, in the order they are signed."""


def signed_bytes(headers: Mapping[str, bytes], value: bytes, *, facts: bool = False) -> bytes:
    """The canonical bytes a message signature covers, v2's with `facts`; see the module docstring."""
    parts = [MESSAGE_DOMAIN_V2 if facts else MESSAGE_DOMAIN]
    for name in SIGNED_HEADERS_V2 if facts else SIGNED_HEADERS:
        field = headers.get(name, b"")
        parts += [name.encode(), b"\x00", struct.pack(">I", len(field)), field]
    parts += [b"sha256\x00", hashlib.sha256(value).digest()]
    return b"".join(parts)


def statement_bytes(statement: bytes) -> bytes:
    return STATEMENT_DOMAIN + statement


@dataclass(frozen=True)
class Signer:
    """Signs what a node publishes to the swarm with the node's key (`sapo.wire.HeaderSigner`)."""

    key: NodeKey

    @property
    def key_id(self) -> str:
        return self.key.key_id

    def sign_headers(self, headers: Sequence[tuple[str, bytes]], value: bytes) -> list[tuple[str, bytes]]:
        """`headers` plus the key id, public key and both signature headers."""
        raw_public = self.key.public.public_bytes_raw()
        out = [
            *(h for h in headers if h[0] not in (H_KEY_ID, H_PUBLIC_KEY, H_SIGNATURE, H_SIGNATURE_V2)),
            (H_KEY_ID, self.key.key_id.encode()),
            (H_PUBLIC_KEY, base64.b64encode(raw_public)),
        ]
        signed = dict(out)
        v1 = self.key.sign(signed_bytes(signed, value))
        v2 = self.key.sign(signed_bytes(signed, value, facts=True))
        return [*out, (H_SIGNATURE, base64.b64encode(v1)), (H_SIGNATURE_V2, base64.b64encode(v2))]


def decode_signature(text: bytes) -> bytes | None:
    """The 64 signature bytes from a header's base64, or None when it is not one."""
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        return None
    return raw if len(raw) == SIGNATURE_BYTES else None


def valid(public: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    try:
        public.verify(signature, data)
    except InvalidSignature:
        return False
    return True
