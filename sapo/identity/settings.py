"""Identity settings, one nested model every service has (`SAPO_<SERVICE>_IDENTITY__...`).

The same block goes to all three services of a node; each uses its part. The generator signs with
the private key; the sampler verifies against the trust list (and the keys topic, and its pins); the
trainer publishes nothing to the swarm and ignores it. Signing happens whenever a key is set, in any
mode, so a swarm can turn identity on without a flag day: every node signs first (mode `off`), then
receivers switch to `strict` or `tofu`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from sapo.identity.keys import IdentityError, NodeKey, parse_private, read_private
from sapo.identity.signing import Signer
from sapo.identity.trust import TrustMode, TrustStore
from sapo.identity.trustlist import TrustList, build_store, load_trust_list

log = logging.getLogger(__name__)


class IdentitySettings(BaseModel):
    """Per-node identity: this node's key, whom it trusts, and how it learns about key changes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: TrustMode = Field(
        TrustMode.OFF,
        description="How swarm groups are verified. off: not at all (node ids are whatever senders say). "
        "strict: only keys of the trust list, or admitted/rotated on the keys topic. tofu (open swarm): "
        "also the first key seen for a new node id, pinned from then on; never a key that contradicts "
        "a pinned one.",
    )
    private_key_file: Path | None = Field(
        None,
        description="This node's Ed25519 private key (PEM, PKCS#8; `sapo keys generate`), e.g. a "
        "mounted Secret. The generator signs every group with it.",
    )
    private_key: SecretStr | None = Field(
        None, description="The same PEM text from the environment (masked in logs); set one or the other."
    )
    trust_file: Path | None = Field(
        None,
        description="Trust list (YAML/JSON: admins, nodes -> public keys, revoked), e.g. a mounted "
        "ConfigMap. Samplers in strict mode need it; read at start.",
    )
    keys_topic: bool = Field(
        False,
        description="Follow the compacted <prefix>.swarm.keys topic: admissions, rotations, revocations.",
    )
    keys_idle_s: float = Field(
        2.0, gt=0, le=600, description="At start the keys topic is read until nothing arrived for this long."
    )
    pins_file: Path | None = Field(
        None,
        description="tofu: where pinned keys are kept across restarts (a writable path); unset = "
        "pins last as long as the process.",
    )
    max_pinned_nodes: int = Field(
        4096, ge=1, le=1_000_000, description="tofu: the most node ids pinned; later newcomers are refused."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.private_key_file is not None and self.private_key is not None:
            raise ValueError("set IDENTITY__PRIVATE_KEY_FILE or IDENTITY__PRIVATE_KEY, not both")
        if self.mode is TrustMode.OFF and (self.trust_file or self.keys_topic):
            raise ValueError(
                "IDENTITY__TRUST_FILE / IDENTITY__KEYS_TOPIC are set but nothing is verified: "
                "set IDENTITY__MODE=strict (or tofu)"
            )
        if self.pins_file is not None and self.mode is not TrustMode.TOFU:
            raise ValueError("IDENTITY__PINS_FILE only applies to IDENTITY__MODE=tofu")
        return self

    @property
    def verifies(self) -> bool:
        return self.mode is not TrustMode.OFF

    def signer(self) -> Signer | None:
        """The node's signer; None when no key is set (allowed only in mode off). Raises IdentityError."""
        key = self._node_key()
        if key is None:
            if self.verifies:
                raise IdentityError(
                    f"identity mode {self.mode} needs this node's key to sign what it shares: set "
                    "IDENTITY__PRIVATE_KEY_FILE (or IDENTITY__PRIVATE_KEY); `sapo keys generate` makes one"
                )
            return None
        log.info("signing with key %s (%s)", key.key_id, key.public_text)
        return Signer(key)

    def _node_key(self) -> NodeKey | None:
        if self.private_key_file is not None:
            return read_private(self.private_key_file)
        if self.private_key is not None:
            return parse_private(self.private_key.get_secret_value().encode(), "IDENTITY__PRIVATE_KEY")
        return None

    def store(self) -> TrustStore | None:
        """The receiver's trust store from the trust list and pins; None in mode off. Raises
        IdentityError naming the file at fault."""
        if not self.verifies:
            return None
        if self.mode is TrustMode.STRICT and self.trust_file is None:
            raise IdentityError("strict identity needs a trust list: set IDENTITY__TRUST_FILE")
        trust = load_trust_list(self.trust_file) if self.trust_file is not None else TrustList()
        pins = None
        if self.pins_file is not None and self.pins_file.exists():
            pins = load_trust_list(self.pins_file)
        store = build_store(
            trust, tofu=self.mode is TrustMode.TOFU, max_pinned_nodes=self.max_pinned_nodes, pins=pins
        )
        log.info("identity %s: %d trusted keys, %d admin keys", self.mode, len(store), len(trust.admins))
        return store
