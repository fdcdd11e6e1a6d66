"""Contribution accounting: what each source node's groups put into one optimizer step.

A step trains on rows (`sapo.trainer.sequences.Row`), each a completion of some node's group. Summed
per node over the rows actually trained on (after the trainer's skips and truncation):

- groups: distinct groups with at least one trained row;
- completions and completion tokens (in the trainer's tokenizer, as packed);
- advantage mass: the sum of |advantage| over those rows. The loss of a row is its advantage times its
  token ratios, so a node whose groups carry no spread in reward contributes no mass however many
  tokens it sends; mass is the share of the step's signal, tokens the share of its normalizer.

The node's own (local) groups count under its own id, so a step's contributions add up to the whole
batch and the external share reads directly off them (1 - own / total).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sapo.trainer.sequences import Row
from sapo.v1 import policy_pb2


@dataclass(frozen=True)
class Contribution:
    node_id: str
    groups: int
    completions: int
    completion_tokens: int
    advantage_mass: float

    def to_proto(self) -> policy_pb2.PeerContribution:
        return policy_pb2.PeerContribution(
            node_id=self.node_id,
            groups=self.groups,
            completions=self.completions,
            completion_tokens=self.completion_tokens,
            advantage_mass=self.advantage_mass,
        )


def contributions(rows: Sequence[Row]) -> list[Contribution]:
    """Per source node, what `rows` hold; by descending advantage mass, then node id."""
    groups: dict[str, set[str]] = {}
    completions: dict[str, int] = {}
    tokens: dict[str, int] = {}
    masses: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(row.peer, set()).add(row.group_id)
        completions[row.peer] = completions.get(row.peer, 0) + 1
        tokens[row.peer] = tokens.get(row.peer, 0) + len(row.sample.completion_ids)
        masses.setdefault(row.peer, []).append(abs(row.sample.advantage))
    found = [
        Contribution(peer, len(groups[peer]), completions[peer], tokens[peer], math.fsum(masses[peer]))
        for peer in groups
    ]
    return sorted(found, key=lambda c: (-c.advantage_mass, c.node_id))
