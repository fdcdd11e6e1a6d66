"""Who sent a group, decided from its headers before it is decoded (step 1 of `sapo.sampler.screen`).

- The node's own rollout topic is the node's: only its generator writes there (topic ACLs keep it
  so on a shared cluster), so its groups' sender is the node itself.
- The swarm stream, identity on (`IDENTITY__MODE=strict|tofu`): the signature is verified against
  the node's `TrustStore`, and the sender is the node the verified key belongs to.
- The swarm stream, identity off: nothing is verified; the sender is whatever the node-id header
  claims ("" when there is none: the body decides). Header and body must still agree, and a claim
  that is no node id (section 1 of docs/contract.md) is refused as "bad_node_id": it names nobody,
  and per-peer counts (metrics, the intake a batch carries) would take it as it came.

`Screen.check` then requires the decoded group to name the sender, so nothing downstream (quotas,
lock-step arrival, contribution counts) can be reached with another node's id. Hostile refusals
raise `InvalidMessageError` (counted and dead-lettered); the ordinary ones (a node this receiver
does not admit, a rotated-out key, a full pin table) are returned as reasons and only counted.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final, Protocol

from sapo.identity.trust import Rejection, Sender
from sapo.sampler.screen import Origin
from sapo.topics import NODE_ID_RE
from sapo.wire import H_NODE, InvalidMessageError, header_str

CLAIMED_SENDERS: Final = 65_536
"""Claimed senders remembered (identity off): a swarm's nodes, not a flood of made-up ids."""


class Identifies(Protocol):
    """`sapo.identity.TrustStore`, or the service's `IdentityGate` around one."""

    def identify(self, headers: Mapping[str, bytes], value: bytes, now_s: float) -> Sender | Rejection: ...


@functools.lru_cache(maxsize=CLAIMED_SENDERS)
def claimed_sender(node_id: str) -> Sender:
    """The unverified sender a node-id header claims ("": none); one object per recent claim, as a
    sampler reading a large swarm without identity builds one per record. Raises InvalidMessageError
    ("bad_node_id") for a claim that is no node id (not cached: an error is built anew each time)."""
    if node_id and not NODE_ID_RE.fullmatch(node_id):
        raise InvalidMessageError("bad_node_id", f"node-id header {node_id!r} is not a node id")
    return Sender(node_id)


def sender_of(
    headers: Mapping[str, bytes],
    value: bytes | None,
    origin: Origin,
    *,
    node_id: str,
    store: Identifies | None,
    now_s: float,
    claimed: str | None = None,
) -> Sender | str:
    """The sender of a record, or the reason it is refused; raises InvalidMessageError when hostile.
    `claimed` is its node header, when the caller read it already (a swarm record's is read first, to
    shed it: `sapo.sampler.core.SamplerCore.sheds`)."""
    if origin == "local":
        return Sender(node_id)
    if store is None:
        return claimed_sender(header_str(headers, H_NODE) if claimed is None else claimed)
    verdict = store.identify(headers, value or b"", now_s)
    if isinstance(verdict, Rejection):
        if verdict.hostile:
            raise InvalidMessageError(verdict.reason, verdict.detail)
        return verdict.reason
    return verdict
