"""Contribution accounting: per source node, the groups, completions, tokens and advantage mass trained."""

from __future__ import annotations

import pytest

from sapo.grpo.layout import TrainSample
from sapo.trainer import Row, RowMode
from sapo.trainer.contributions import contributions

pytestmark = pytest.mark.unit


def _row(peer: str, group_id: str, tokens: int, advantage: float, *, local: bool = False) -> Row:
    sample = TrainSample((1, 2), tuple(range(tokens)), advantage, None)
    return Row(sample, 1.0, RowMode.ON_POLICY, 0.5, local, peer, group_id)


def test_rows_add_up_per_node_with_groups_counted_once_and_mass_as_absolute_advantages() -> None:
    rows = [
        _row("node-a", "g1", 4, 1.0, local=True),
        _row("node-a", "g1", 6, -1.0, local=True),
        _row("node-b", "g2", 3, 0.5),
        _row("node-b", "g3", 2, -1.5),
        _row("node-b", "g3", 5, 1.5),
        _row("node-c", "g4", 7, 0.0),
    ]

    found = contributions(rows)

    assert [c.node_id for c in found] == ["node-b", "node-a", "node-c"]  # by descending mass
    b, a, c = found
    assert (b.groups, b.completions, b.completion_tokens) == (2, 3, 10)
    assert b.advantage_mass == pytest.approx(3.5)
    assert (a.groups, a.completions, a.completion_tokens) == (1, 2, 10)
    assert a.advantage_mass == pytest.approx(2.0)
    assert (c.groups, c.completions, c.completion_tokens, c.advantage_mass) == (1, 1, 7, 0.0)
    proto = b.to_proto()
    assert (proto.node_id, proto.groups, proto.completion_tokens) == ("node-b", 2, 10)


def test_no_rows_no_contributions() -> None:
    assert contributions([]) == []


def test_equal_mass_orders_by_node_id() -> None:
    found = contributions([_row("node-z", "g1", 1, 1.0), _row("node-m", "g2", 1, -1.0)])
    assert [c.node_id for c in found] == ["node-m", "node-z"]
