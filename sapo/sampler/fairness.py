"""Who gets a place in a full external pool: fair shares per verified identity.

The pool holds the node's own groups and the swarm's apart (`sapo.sampler.pool`), so nothing a peer
sends can evict a node's own group. Within the external pool, places are shared max-min fairly
between the verified identities that sent groups:

- while there is room, every group is admitted;
- when it is full, a newcomer of peer P takes the place of the oldest group of the peer holding the
  most groups, but only if P would then still hold fewer than that peer held (a strict improvement
  of balance); a peer that holds the most itself replaces its own oldest group (it only ever
  displaces itself); anyone else is refused ("pool_full").

So a group is never evicted for a peer that holds as many groups as its owner, a flooding peer ends
up with the same share as any other peer that sends as much and can never displace a smaller
holder, and peers that send few groups keep all of theirs. Many identities are many peers: within
`strict` identity they must each be admitted by the trust list, within `tofu` they are bounded by
the pin limit (`sapo.identity`), and here each gets one share like everyone else, first come first
served once shares are equal.
"""

from __future__ import annotations

from enum import Enum


class Admission(Enum):
    """What becomes of a newcomer: pooled in free room, pooled in place of its own peer's oldest
    group, pooled in place of the largest holder's oldest group, or refused."""

    ROOM = "room"
    REPLACE_OWN = "replace_own"
    REPLACE_LARGEST = "replace_largest"
    REFUSE = "refuse"


def admission(own: int, largest: int, total: int, capacity: int) -> Admission:
    """The fate of a group whose peer holds `own` groups, in a pool holding `total` (at most
    `capacity`) whose largest holder holds `largest`. See the module docstring.

    Takes counts, not the pool, so the pool answers in constant time whatever the number of peers.
    """
    if total < capacity:
        return Admission.ROOM
    if own > 0 and own == largest:
        return Admission.REPLACE_OWN
    return Admission.REPLACE_LARGEST if own + 1 < largest else Admission.REFUSE
