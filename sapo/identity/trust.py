"""Who may speak for which node: the receiver's key list, message verification, key announcements.

A `TrustStore` maps key ids to (node id, public key). It is filled from a trust list file (the root of
trust: node keys and swarm admin keys), from announcements on the compacted keys topic, and in an open
swarm (`tofu`) from first use. `identify` turns a message's headers into the verified `Sender`, or a
`Rejection` whose reason is a metric label:

- `unsigned`: no key id or signature header. `missing_node_id`: signed, but names no node.
  `bad_node_id`: in an open swarm, the first key of a name that is no node id (section 1 of
  docs/contract.md), which is never pinned; the same reason as without identity.
- `bad_signature`: the signature does not verify (forged, edited headers, headers moved onto another
  body), or the public key header does not match the key id. A record with the v2 signature
  (`sapo.identity.signing`) is judged by it alone, so a facts header edited under it is refused too.
- `identity_mismatch`: a valid signature by a key of node A on a message that claims node B.
- `key_conflict`: a key this receiver does not know for a node it knows (a forged key, or a rotation
  used before its announcement arrived).
- `unknown_key`: a key of a node this receiver does not know (strict: a node not admitted).
- `revoked_key`: a revoked key. `retired_key`: a rotated-out key after its overlap window.
- `pin_limit`: an open swarm already pinned `max_pinned_nodes` node ids.

The `HOSTILE` ones are dead-lettered; the others are ordinary in a shared swarm and only counted.

Announcement rules (`apply`; the reasoning is in docs/identity.md):
- an admission (no previous key) needs a swarm admin signature: the admin vouches for the public
  key the node's operator handed over, no private key leaves its node; in an open swarm the first
  key of a never-seen node id is pinned instead, if the key itself signs (proof of possession);
- every key is bound to one node: a key already bound elsewhere is refused;
- a rotation names the node's current key, which signs it with the new one; the old key stays valid until
  `retire_previous_at` (the overlap window) and can sign only one rotation, so a stolen key cannot
  rotate the node again once its owner has;
- a REVOKE is signed by the revoked key itself or an admin; a revoked key id is never accepted again,
  and a node whose keys were revoked is not re-pinned on first use (it needs an admin or the file).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.message import DecodeError

from sapo.identity.keys import IdentityError, key_id, public_from_raw
from sapo.identity.signing import (
    H_KEY_ID,
    H_PUBLIC_KEY,
    H_SIGNATURE,
    H_SIGNATURE_V2,
    decode_signature,
    signed_bytes,
    statement_bytes,
    valid,
)
from sapo.topics import NODE_ID_RE
from sapo.v1 import identity_pb2
from sapo.wire import H_NODE, SCHEMA_VERSION, header_str

IDENTITY_REASONS: Final = (
    "unsigned",
    "missing_node_id",
    "bad_node_id",
    "bad_signature",
    "identity_mismatch",
    "key_conflict",
    "unknown_key",
    "revoked_key",
    "retired_key",
    "pin_limit",
)
ORDINARY: Final = frozenset({"unknown_key", "retired_key", "pin_limit"})
"""Reasons that are ordinary in a shared swarm (a node not admitted, a rotated-out key, a full pin
table): counted only."""
HOSTILE: Final = frozenset(IDENTITY_REASONS) - ORDINARY
"""Reasons that mean the sender lies or is broken: dead-lettered, not just counted."""
ANNOUNCEMENT_RESULTS: Final = (
    *("added", "rotated", "pinned", "revoked", "unchanged", "bad_statement"),
    *(r for r in IDENTITY_REASONS if r not in ("unsigned", "missing_node_id", "bad_node_id")),
)
"""What `TrustStore.apply` returns: the first five are accepted, the rest rejections."""
MAX_ANNOUNCEMENT_BYTES: Final = 16 * 1024
MAX_SIGNATURES: Final = 8


class TrustMode(StrEnum):
    """How a receiver treats identities (setting `IDENTITY__MODE`)."""

    OFF = "off"  # nothing signed or verified: a node id is whatever the sender says
    STRICT = "strict"  # only keys from the trust list, admitted or rotated through the keys topic
    TOFU = "tofu"  # also the first key seen for a never-seen node id, pinned from then on


@dataclass(frozen=True)
class Sender:
    """Who sent a message, as far as the receiver can tell. `key_id` is "" when nothing was verified
    (the node's own private topic, or identity off). `facts_signed`: a verified signature covered the
    facts header too (`sapo.identity.signing`, v2); a verified sender's facts are trusted only then."""

    node_id: str
    key_id: str = ""
    facts_signed: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str = ""

    @property
    def hostile(self) -> bool:
        return self.reason in HOSTILE


@dataclass
class TrustedKey:
    node_id: str
    public: Ed25519PublicKey
    key_id: str
    source: str  # "file", "topic" or "pinned"
    retire_at: float | None = None  # epoch seconds from which the key is refused
    successor: str | None = None  # the key that rotated this one out


@dataclass
class _Announcement:
    statement: identity_pb2.KeyStatement
    signed: bytes
    signatures: dict[str, bytes] = field(default_factory=dict)


class TrustStore:
    """The receiver's keys; see the module docstring. Not thread-safe: one consumer thread owns it."""

    def __init__(
        self, *, tofu: bool = False, admins: Iterable[Ed25519PublicKey] = (), max_pinned_nodes: int = 4096
    ) -> None:
        self.tofu = tofu
        self.max_pinned_nodes = max_pinned_nodes
        self._admins = {key_id(a): a for a in admins}
        self._keys: dict[str, TrustedKey] = {}
        self._seen_nodes: set[str] = set()
        self._revoked: set[str] = set()
        self._pinned = 0
        self._new_pins: list[TrustedKey] = []

    # --- contents ---

    def add(self, node_id: str, public: Ed25519PublicKey, source: str) -> TrustedKey:
        """Trust `public` for `node_id`; raises IdentityError when the key belongs to another node."""
        kid = key_id(public)
        existing = self._keys.get(kid)
        if existing is not None:
            if existing.node_id != node_id:
                raise IdentityError(f"key {kid} is {existing.node_id}'s, not {node_id}'s")
            return existing
        entry = TrustedKey(node_id, public, kid, source)
        if source == "pinned" and node_id not in self._seen_nodes:
            self._pinned += 1
        self._keys[kid] = entry
        self._seen_nodes.add(node_id)
        return entry

    def revoke(self, kid: str) -> None:
        """Never accept `kid` again; its node stays known (it is not re-pinned on first use)."""
        self._revoked.add(kid)
        self._keys.pop(kid, None)

    def entries(self) -> list[TrustedKey]:
        return sorted(self._keys.values(), key=lambda e: (e.node_id, e.key_id))

    def get(self, kid: str) -> TrustedKey | None:
        return self._keys.get(kid)

    def is_revoked(self, kid: str) -> bool:
        return kid in self._revoked

    def __len__(self) -> int:
        return len(self._keys)

    def take_new_pins(self) -> list[TrustedKey]:
        """Keys pinned on first use since the last call (the caller persists them)."""
        pins, self._new_pins = self._new_pins, []
        return pins

    # --- messages ---

    def identify(self, headers: Mapping[str, bytes], value: bytes, now_s: float) -> Sender | Rejection:
        """The verified sender of a signed message, or why it is refused (module docstring)."""
        kid = header_str(headers, H_KEY_ID)
        facts = H_SIGNATURE_V2 in headers  # v2 covers all that v1 does, and the facts header
        raw_signature = headers.get(H_SIGNATURE_V2 if facts else H_SIGNATURE)
        if not kid or raw_signature is None:
            return Rejection("unsigned")
        node = header_str(headers, H_NODE)[:64]  # a claim: bounded before it reaches logs and dead letters
        if not node:
            return Rejection("missing_node_id", "a signed message must name its node")
        signature = decode_signature(raw_signature)
        if signature is None:
            return Rejection("bad_signature", "not a base64 Ed25519 signature")
        if kid in self._revoked:
            return Rejection("revoked_key", f"key {kid}")
        data = signed_bytes(headers, value, facts=facts)
        entry = self._keys.get(kid)
        if entry is None:
            return self._first_use(node, kid, headers.get(H_PUBLIC_KEY), signature, data, facts=facts)
        if not valid(entry.public, signature, data):
            return Rejection("bad_signature", f"key {kid}")
        if entry.node_id != node:
            return Rejection("identity_mismatch", f"key {kid} is {entry.node_id}'s, not {node}'s")
        if entry.retire_at is not None and now_s >= entry.retire_at:
            return Rejection("retired_key", f"key {kid} of {node} rotated out")
        return Sender(node, kid, facts)

    def _first_use(
        self, node: str, kid: str, raw_public: bytes | None, signature: bytes, data: bytes, *, facts: bool
    ) -> Sender | Rejection:
        if node in self._seen_nodes:
            return Rejection("key_conflict", f"{kid} is not a key of {node}")
        if not self.tofu:
            return Rejection("unknown_key", f"{node} is not admitted")
        public = _header_public(raw_public)
        if public is None or key_id(public) != kid:
            return Rejection("bad_signature", "the public key header does not match the key id")
        if not valid(public, signature, data):
            return Rejection("bad_signature", f"key {kid}")
        if not NODE_ID_RE.fullmatch(node):
            return Rejection("bad_node_id", f"{node!r} is not a node id")
        return self._pin(node, public, facts=facts)

    def _pin(self, node: str, public: Ed25519PublicKey, *, facts: bool) -> Sender | Rejection:
        if self._pinned >= self.max_pinned_nodes:
            return Rejection("pin_limit", f"{self._pinned} node ids pinned")
        entry = self.add(node, public, "pinned")
        self._new_pins.append(entry)
        return Sender(node, entry.key_id, facts)

    # --- announcements ---

    def apply(self, value: bytes | None, now_s: float) -> str:
        """Apply one keys-topic record; the result label (`ANNOUNCEMENT_RESULTS`)."""
        parsed = parse_announcement(value)
        if isinstance(parsed, str):
            return parsed
        st = parsed.statement
        if st.action == identity_pb2.KEY_ACTION_ADD:
            return self._apply_add(parsed, now_s)
        if st.action == identity_pb2.KEY_ACTION_REVOKE:
            return self._apply_revoke(parsed)
        return "bad_statement"

    def _signed_by(self, ann: _Announcement, kid: str, public: Ed25519PublicKey) -> bool:
        signature = ann.signatures.get(kid)
        return signature is not None and valid(public, signature, statement_bytes(ann.signed))

    def _admin_signed(self, ann: _Announcement) -> bool:
        return any(self._signed_by(ann, kid, public) for kid, public in self._admins.items())

    def _apply_add(self, ann: _Announcement, now_s: float) -> str:
        st = ann.statement
        try:
            public = public_from_raw(st.public_key)
        except IdentityError:
            return "bad_statement"
        if key_id(public) != st.key_id:
            return "bad_statement"
        possessed = self._signed_by(ann, st.key_id, public)  # the new key signs: its holder speaks
        if st.key_id in self._revoked:
            return "revoked_key"
        existing = self._keys.get(st.key_id)
        if existing is not None and existing.node_id != st.node_id:
            return "identity_mismatch"
        if st.previous_key_id:
            return self._apply_rotation(ann, public, now_s) if possessed else "bad_signature"
        if existing is not None:
            return "unchanged"
        if self._admin_signed(ann):
            self.add(st.node_id, public, "topic")
            return "added"
        if not possessed:
            return "bad_signature"
        if st.node_id in self._seen_nodes:
            return "key_conflict"
        if not self.tofu:
            return "unknown_key"
        pinned = self._pin(st.node_id, public, facts=False)
        return "pinned" if isinstance(pinned, Sender) else pinned.reason

    def _apply_rotation(self, ann: _Announcement, public: Ed25519PublicKey, now_s: float) -> str:
        st = ann.statement
        previous = self._keys.get(st.previous_key_id)
        if previous is None:
            return "revoked_key" if st.previous_key_id in self._revoked else "unknown_key"
        if previous.node_id != st.node_id:
            return "identity_mismatch"
        if not self._signed_by(ann, previous.key_id, previous.public):
            return "bad_signature"
        if previous.successor == st.key_id:
            return "unchanged"  # the same rotation read again (a restart re-reads the topic)
        if previous.successor is not None:
            return "key_conflict"  # a key signs one rotation: a stolen old key cannot fork the node
        if previous.retire_at is not None and now_s >= previous.retire_at:
            return "retired_key"
        self.add(st.node_id, public, "topic")
        retire = st.retire_previous_at.ToNanoseconds() / 1e9 if st.HasField("retire_previous_at") else now_s
        previous.successor = st.key_id
        previous.retire_at = retire if previous.retire_at is None else min(retire, previous.retire_at)
        return "rotated"

    def _apply_revoke(self, ann: _Announcement) -> str:
        st = ann.statement
        if st.key_id in self._revoked:
            return "unchanged"
        target = self._keys.get(st.key_id)
        public = target.public if target is not None else None
        if public is None and st.public_key:
            try:
                public = public_from_raw(st.public_key)
            except IdentityError:
                return "bad_statement"
        if public is not None and key_id(public) != st.key_id:
            return "bad_statement"
        own = public is not None and self._signed_by(ann, st.key_id, public)
        if not (own or self._admin_signed(ann)):
            return "bad_signature"
        if target is not None and target.node_id != st.node_id:
            return "identity_mismatch"
        # Known from now on even when this receiver never saw the key (one pinned from its groups is
        # on no record, a restart's pins no longer hold a revoked key): never re-pinned on first use.
        self._seen_nodes.add(st.node_id)
        self.revoke(st.key_id)
        return "revoked"


def parse_announcement(value: bytes | None) -> _Announcement | str:
    """The announcement's statement and signatures, or "bad_statement" when it is not one."""
    if not value or len(value) > MAX_ANNOUNCEMENT_BYTES:
        return "bad_statement"
    envelope = identity_pb2.KeyAnnouncement()
    statement = identity_pb2.KeyStatement()
    try:
        envelope.ParseFromString(value)
        statement.ParseFromString(envelope.statement)
    except DecodeError:
        return "bad_statement"
    if (
        statement.schema_version != SCHEMA_VERSION
        or not NODE_ID_RE.fullmatch(statement.node_id)
        or len(envelope.signatures) > MAX_SIGNATURES
    ):
        return "bad_statement"
    signatures = {s.key_id: s.signature for s in envelope.signatures}
    return _Announcement(statement, envelope.statement, signatures)


def _header_public(raw: bytes | None) -> Ed25519PublicKey | None:
    if raw is None:
        return None
    try:
        return public_from_raw(base64.b64decode(raw, validate=True))
    except (binascii.Error, IdentityError):
        return None
