"""Signed groups and announcements for identity tests."""

from __future__ import annotations

from sapo import wire
from sapo.identity.announce import add_statement, announcement, revoke_statement
from sapo.identity.keys import NodeKey
from sapo.identity.signing import Signer
from tests.factories import make_group

NOW = 1_000_000.0


def signed(node: str, key: NodeKey, body_node: str | None = None) -> tuple[dict[str, bytes], bytes]:
    """(headers, value) of a group claiming `node`, signed with `key`; the body says `body_node`."""
    group = make_group(node_id=body_node or node)
    value = group.SerializeToString()
    headers = wire.message_headers("RolloutGroup", node, value, group.question.task)
    return dict(Signer(key).sign_headers(headers, value)), value


def admit(node: str, key: NodeKey, *signers: NodeKey) -> bytes:
    return announcement(add_statement(node, key.public, NOW), [key, *signers])


def rotate(node: str, old: NodeKey, new: NodeKey, overlap_s: float, now: float = NOW) -> bytes:
    statement = add_statement(node, new.public, now, previous_key_id=old.key_id, overlap_s=overlap_s)
    return announcement(statement, [new, old])


def revoke(node: str, key_id: str, signer: NodeKey) -> bytes:
    return announcement(revoke_statement(node, key_id, NOW, signer), [signer])
