"""The trust list file: the keys a receiver trusts before it reads anything from the swarm.

YAML (or JSON, which YAML reads too); on Kubernetes a ConfigMap mounted as a file:

    admins:                     # keys whose signed announcements admit nodes (optional)
      - ed25519:3q2+7w...
    nodes:                      # node id -> its keys; two during a rotation's overlap
      node-0: [ed25519:AAAA...]
      node-1: [ed25519:BBBB..., ed25519:CCCC...]
    revoked:                    # key ids never accepted again (optional)
      - 5f1c0a...

Public keys only: the file may be world-readable. An open swarm's pins are written in the same
format (`nodes` only), so a restarted receiver keeps what it pinned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sapo.identity.keys import KEY_ID_RE, IdentityError, key_id, parse_public, public_text
from sapo.identity.trust import TrustStore
from sapo.topics import validate_node_id

HEADER = "# sapo trust list: node id -> Ed25519 public keys (see docs/identity.md)\n"


class TrustList(BaseModel):
    """A trust list as read from or written to a file; every key parsed and checked on load."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    admins: tuple[str, ...] = Field((), description="Swarm admin public keys (admit nodes by announcement).")
    nodes: dict[str, tuple[str, ...]] = Field(default_factory=dict, description="Node id -> public keys.")
    revoked: tuple[str, ...] = Field((), description="Key ids that are never accepted.")

    @field_validator("admins")
    @classmethod
    def _check_admins(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for text in keys:
            parse_public(text)
        return keys

    @field_validator("nodes")
    @classmethod
    def _check_nodes(cls, nodes: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        owner: dict[str, str] = {}
        for node, keys in nodes.items():
            validate_node_id(node)
            if not keys:
                raise ValueError(f"node {node} lists no key; remove it or add one")
            for text in keys:
                kid = key_id(parse_public(text))
                if owner.setdefault(kid, node) != node:
                    raise ValueError(f"key {kid} is listed for both {owner[kid]} and {node}")
        return nodes

    @field_validator("revoked")
    @classmethod
    def _check_revoked(cls, ids: tuple[str, ...]) -> tuple[str, ...]:
        bad = [kid for kid in ids if not KEY_ID_RE.fullmatch(kid)]
        if bad:
            raise ValueError(f"revoked entries {bad} are not key ids (32 lower-case hex characters)")
        return ids

    @model_validator(mode="after")
    def _check_revoked_unlisted(self) -> Self:
        listed = {key_id(parse_public(t)) for keys in self.nodes.values() for t in keys}
        both = sorted(listed.intersection(self.revoked))
        if both:
            raise ValueError(f"keys {both} are both listed and revoked; remove them from `nodes`")
        return self

    def with_key(self, node: str, public: str) -> TrustList:
        """This list plus `public` for `node` (kept when already there)."""
        keys = self.nodes.get(node, ())
        if public in keys:
            return self
        return parse_trust_list(self.model_dump() | {"nodes": self.nodes | {node: (*keys, public)}})

    def without_key(self, kid: str, *, revoke: bool = False) -> TrustList:
        """This list without the key `kid` (and with it revoked when `revoke`)."""
        nodes = {
            node: kept
            for node, keys in self.nodes.items()
            if (kept := tuple(t for t in keys if key_id(parse_public(t)) != kid))
        }
        revoked = (*self.revoked, kid) if revoke and kid not in self.revoked else self.revoked
        return parse_trust_list({"admins": self.admins, "nodes": nodes, "revoked": revoked})

    def with_admin(self, public: str) -> TrustList:
        if public in self.admins:
            return self
        return parse_trust_list(self.model_dump() | {"admins": (*self.admins, public)})


def load_trust_list(path: Path) -> TrustList:
    """Read and check a trust list; raises IdentityError naming the file and every problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise IdentityError(f"cannot read trust list {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise IdentityError(f"trust list {path} is not UTF-8 text: {exc}") from None
    except yaml.YAMLError as exc:
        raise IdentityError(f"trust list {path} is not YAML or JSON: {exc}") from None
    try:
        return parse_trust_list(data or {})
    except IdentityError as exc:
        raise IdentityError(f"{path}: {exc}") from None


def parse_trust_list(data: object) -> TrustList:
    """A checked trust list, or IdentityError listing every problem in one line."""
    try:
        return TrustList.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'list'}: {e['msg']}" for e in exc.errors())
        raise IdentityError(f"invalid trust list: {problems}") from None


def save_trust_list(path: Path, trust: TrustList) -> None:
    """Write whole, then rename, so a reader never sees half a file."""
    data = {
        "admins": list(trust.admins),
        "nodes": {node: list(keys) for node, keys in sorted(trust.nodes.items())},
        "revoked": list(trust.revoked),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(HEADER + yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)


def build_store(
    trust: TrustList, *, tofu: bool, max_pinned_nodes: int, pins: TrustList | None = None
) -> TrustStore:
    """A store holding the trust list (and an open swarm's earlier pins, except those of a node the
    list names: its keys are the list's, as a running store refuses another key for a listed node);
    raises IdentityError when a pinned key now belongs to another node in the trust list."""
    store = TrustStore(
        tofu=tofu, admins=[parse_public(t) for t in trust.admins], max_pinned_nodes=max_pinned_nodes
    )
    for kid in trust.revoked:
        store.revoke(kid)
    sources = [(trust, "file"), (pins, "pinned")] if pins is not None else [(trust, "file")]
    for listed, source in sources:
        for node, keys in listed.nodes.items():
            if source == "pinned" and node in trust.nodes:
                continue  # pinned before the list named it: whoever claimed it first
            for text in keys:
                public = parse_public(text)
                if not store.is_revoked(key_id(public)):
                    store.add(node, public, source)
    return store


def save_pins(path: Path, store: TrustStore) -> None:
    """Write every key the store pinned on first use, as a trust list's `nodes`."""
    nodes: dict[str, tuple[str, ...]] = {}
    for entry in store.entries():
        if entry.source == "pinned":
            nodes[entry.node_id] = (*nodes.get(entry.node_id, ()), public_text(entry.public))
    save_trust_list(path, TrustList(nodes=nodes))
