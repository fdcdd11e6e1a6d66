"""What the kit says of a service that reacted to nothing, when the broker does not answer."""

from __future__ import annotations

import pytest

from sapo.conformance.common import Target, unread
from sapo.conformance.observe import Committed

pytestmark = pytest.mark.unit

NOBODY = {"bootstrap.servers": "127.0.0.1:1", "socket.connection.setup.timeout.ms": "1000"}
"""A port nothing listens on: every request of the kit times out."""


def test_offsets_the_broker_did_not_answer_are_not_read_as_nothing_committed() -> None:
    target = Target(service="trainer", node="node-a", prefix="sapo", kafka=NOBODY)
    commits = Committed(NOBODY, "sapo.node-a.trainer", timeout_s=1.0)
    try:
        assert commits.read([("sapo.node.node-a.batches", 0)]) is None
        said = unread(target, [(commits, [("sapo.node.node-a.batches", 0, 0)])])
    finally:
        commits.close()
    assert said == "; the broker did not answer for sapo.node-a.trainer's committed offsets"
