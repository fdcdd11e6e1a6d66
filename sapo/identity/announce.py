"""Key announcements as `sapo keys announce` makes them: statements, their signatures, record keys.

The rules receivers apply are in `sapo.identity.trust`; this module only builds what they read. The
keys topic is compacted with record key `<node_id>/<key_id>` for a key's ADD and
`<node_id>/<key_id>/revoked` for its REVOKE: compaction keeps both, so a rotation's record (the one
that retired the previous key) outlives the new key's revocation, and is never replaced by another
key's. Read in order, the revocation still comes after the ADD it revokes.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.timestamp_pb2 import Timestamp

from sapo.identity.keys import NodeKey, key_id
from sapo.identity.signing import statement_bytes
from sapo.topics import validate_node_id
from sapo.v1 import identity_pb2
from sapo.wire import SCHEMA_VERSION


def _timestamp(epoch_s: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(epoch_s * 1e9))
    return ts


def add_statement(
    node_id: str,
    public: Ed25519PublicKey,
    now_s: float,
    *,
    previous_key_id: str = "",
    overlap_s: float = 0.0,
) -> identity_pb2.KeyStatement:
    """Bind `public` to `node_id`; with `previous_key_id`, a rotation whose old key stays valid for
    `overlap_s` seconds from `now_s`."""
    statement = identity_pb2.KeyStatement(
        schema_version=SCHEMA_VERSION,
        action=identity_pb2.KEY_ACTION_ADD,
        node_id=validate_node_id(node_id),
        key_id=key_id(public),
        public_key=public.public_bytes_raw(),
        issued_at=_timestamp(now_s),
    )
    if previous_key_id:
        statement.previous_key_id = previous_key_id
        statement.retire_previous_at.CopyFrom(_timestamp(now_s + overlap_s))
    return statement


def revoke_statement(node_id: str, key_id: str, now_s: float, signer: NodeKey) -> identity_pb2.KeyStatement:
    """Revoke `key_id`. When the key revokes itself its public key goes along: a key pinned from its
    groups is on no other record, and a receiver that never saw it still needs it to check the
    signature."""
    statement = identity_pb2.KeyStatement(
        schema_version=SCHEMA_VERSION,
        action=identity_pb2.KEY_ACTION_REVOKE,
        node_id=validate_node_id(node_id),
        key_id=key_id,
        issued_at=_timestamp(now_s),
    )
    if signer.key_id == key_id:
        statement.public_key = signer.public.public_bytes_raw()
    return statement


def announcement(statement: identity_pb2.KeyStatement, signers: Sequence[NodeKey]) -> bytes:
    """The serialized KeyAnnouncement: the statement's bytes signed by every key in `signers`."""
    signed = statement.SerializeToString()
    envelope = identity_pb2.KeyAnnouncement(statement=signed)
    for key in dict((k.key_id, k) for k in signers).values():
        envelope.signatures.add(key_id=key.key_id, signature=key.sign(statement_bytes(signed)))
    return envelope.SerializeToString()


def record_key(statement: identity_pb2.KeyStatement) -> bytes:
    revoked = "/revoked" if statement.action == identity_pb2.KEY_ACTION_REVOKE else ""
    return f"{statement.node_id}/{statement.key_id}{revoked}".encode()
