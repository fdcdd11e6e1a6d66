"""Per-node identity: Ed25519 node keys, signed swarm messages, trust lists and key announcements.

`keys` (key pairs, key ids, files), `signing` (what a signature covers), `trust` (the receiver's
`TrustStore`: verification and announcement rules), `trustlist` (the trust list file), `announce`
(building announcements), `settings` (the nested `IDENTITY__*` settings), `cli` (`sapo keys`). No
transport here: the keys topic is followed by `sapo.node.identity`. The threat model and procedures
are in docs/identity.md.
"""

from sapo.identity.keys import IdentityError, NodeKey, key_id, parse_public, public_text
from sapo.identity.signing import H_KEY_ID, H_PUBLIC_KEY, H_SIGNATURE, H_SIGNATURE_V2, Signer, signed_bytes
from sapo.identity.trust import HOSTILE, IDENTITY_REASONS, Rejection, Sender, TrustMode, TrustStore

__all__ = [
    "HOSTILE",
    "H_KEY_ID",
    "H_PUBLIC_KEY",
    "H_SIGNATURE",
    "H_SIGNATURE_V2",
    "IDENTITY_REASONS",
    "IdentityError",
    "NodeKey",
    "Rejection",
    "Sender",
    "Signer",
    "TrustMode",
    "TrustStore",
    "key_id",
    "parse_public",
    "public_text",
    "signed_bytes",
]
