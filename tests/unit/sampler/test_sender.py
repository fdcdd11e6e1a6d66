"""Identity on the sampler's path (`sender_of` -> `parse` -> `Screen.check`, the order `_admit` runs
them in): every hostile case refused by its reason, and none of them counted as a lock-step arrival."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from sapo.identity import H_KEY_ID, H_SIGNATURE, H_SIGNATURE_V2, NodeKey, Sender, Signer, TrustStore
from sapo.identity.announce import add_statement, announcement
from sapo.sampler import Scored, Screen, SeenGroups, parse, sender_of
from sapo.sampler.screen import Origin
from sapo.v1 import rollout_pb2
from sapo.wire import H_NODE, H_TASK, InvalidMessageError, rollout_headers
from tests.unit.sampler.builders import questions, real_group, screen_config

pytestmark = pytest.mark.unit

NODE = "node-0"
RECORDS = questions(node_seed=23, count=8)
PEER_1, PEER_2 = NodeKey.generate(), NodeKey.generate()
Message = tuple[dict[str, bytes], bytes]


class Receiver:
    """One node's identity step and screen, recording lock-step arrivals."""

    def __init__(self, store: TrustStore | None) -> None:
        self.arrivals: list[str] = []
        self.screen = Screen(
            screen_config(NODE, max_external_age_s=600.0),
            SeenGroups(100),
            on_arrival=lambda node, _group_id, _round, _origin, _now: self.arrivals.append(node),
        )
        self.store = store

    def receive(
        self, message: Message, origin: Origin = "external", now: float | None = None
    ) -> Scored | str:
        headers, value = message
        now = time.time() if now is None else now
        sender = sender_of(headers, value, origin, node_id=NODE, store=self.store, now_s=now)
        if isinstance(sender, str):
            return sender
        return self.screen.check(parse(value, 1 << 20, headers), origin, now, 0, sender)

    def refused(self, message: Message) -> str:
        """The reason of a hostile refusal: raised, so the consumer loop dead-letters it."""
        with pytest.raises(InvalidMessageError) as info:
            self.receive(message)
        return info.value.reason


def strict() -> Receiver:
    store = TrustStore()
    store.add("peer-1", PEER_1.public, "file")
    store.add("peer-2", PEER_2.public, "file")
    return Receiver(store)


def group(node: str = "peer-1", i: int = 0) -> rollout_pb2.RolloutGroup:
    return real_group(RECORDS[i], node)


def sent(
    body: rollout_pb2.RolloutGroup, key: NodeKey | None, claims: Mapping[str, str] | None = None
) -> Message:
    """`body` with routing headers as a generator makes them, except for the `claims` (node, task)
    it lies about, signed with `key` (None: unsigned)."""
    value = body.SerializeToString()
    claimed = rollout_pb2.RolloutGroup()
    claimed.CopyFrom(body)  # the same facts header as the body's: node and task are not facts
    claims = claims or {}
    claimed.node_id = claims.get("node", claimed.node_id)
    claimed.question.task = claims.get("task", claimed.question.task)
    return dict(rollout_headers(claimed, value, Signer(key) if key is not None else None)), value


def test_an_honest_signed_group_is_scored_and_arrives_as_its_signer() -> None:
    receiver = strict()
    verdict = receiver.receive(sent(group(), PEER_1))
    assert isinstance(verdict, Scored) and verdict.peer == "peer-1"
    assert receiver.arrivals == ["peer-1"]


def test_impersonation_by_an_admitted_node_is_an_identity_mismatch() -> None:
    receiver = strict()
    assert receiver.refused(sent(group("peer-1"), PEER_2)) == "identity_mismatch"
    assert receiver.arrivals == []


def test_a_body_that_names_another_node_than_its_signed_headers_is_an_identity_mismatch() -> None:
    receiver = strict()
    assert receiver.refused(sent(group("peer-1"), PEER_2, {"node": "peer-2"})) == "identity_mismatch"
    assert receiver.arrivals == []


def test_a_body_of_another_task_than_its_signed_headers_is_a_header_mismatch() -> None:
    receiver = strict()
    other_task = next(r.task for r in RECORDS if r.task != RECORDS[0].task)
    assert receiver.refused(sent(group("peer-1"), PEER_1, {"task": other_task})) == "header_mismatch"
    assert receiver.arrivals == []


def test_a_forged_key_for_a_known_node_is_a_key_conflict() -> None:
    receiver = strict()
    assert receiver.refused(sent(group("peer-1"), NodeKey.generate())) == "key_conflict"
    assert receiver.arrivals == []


def test_a_forged_signature_or_edited_headers_are_a_bad_signature() -> None:
    receiver = strict()
    headers, value = sent(group("peer-1"), NodeKey.generate())
    assert receiver.refused((headers | {H_KEY_ID: PEER_1.key_id.encode()}, value)) == "bad_signature"
    headers, value = sent(group("peer-1"), PEER_1)
    other_task = next(r.task for r in RECORDS if r.task != RECORDS[0].task)
    assert receiver.refused((headers | {H_TASK: other_task.encode()}, value)) == "bad_signature"
    assert receiver.refused((headers, group("peer-1", 1).SerializeToString())) == "bad_signature"
    assert receiver.arrivals == []


def test_unsigned_groups_are_refused_on_the_swarm_stream_only() -> None:
    receiver = strict()
    assert receiver.refused(sent(group("peer-1"), None)) == "unsigned"
    headers, value = sent(group("peer-1"), PEER_1)
    unsigned = {k: v for k, v in headers.items() if k not in {H_SIGNATURE, H_SIGNATURE_V2}}
    assert receiver.refused((unsigned, value)) == "unsigned"
    # The node's own private topic is the node's: its own groups need no signature.
    assert isinstance(receiver.receive(sent(group(NODE), None), "local"), Scored)
    assert receiver.arrivals == [NODE]
    # ...and only its own: a local group naming another node is refused.
    with pytest.raises(InvalidMessageError, match="identity_mismatch"):
        receiver.receive(sent(group("peer-1"), None), "local")


def test_revoked_keys_are_dead_lettered_and_rotated_out_keys_only_counted() -> None:
    receiver = strict()
    assert receiver.store is not None
    new = NodeKey.generate()
    now = time.time()
    rotation = add_statement("peer-1", new.public, now, previous_key_id=PEER_1.key_id, overlap_s=60)
    assert receiver.store.apply(announcement(rotation, [new, PEER_1]), now) == "rotated"
    assert isinstance(receiver.receive(sent(group("peer-1", 1), PEER_1), now=now + 30), Scored)
    assert isinstance(receiver.receive(sent(group("peer-1", 2), new), now=now + 30), Scored)
    assert receiver.receive(sent(group("peer-1", 3), PEER_1), now=now + 61) == "retired_key"
    receiver.store.revoke(PEER_2.key_id)
    assert receiver.refused(sent(group("peer-2"), PEER_2)) == "revoked_key"
    assert receiver.arrivals == ["peer-1", "peer-1"]


def test_strict_refuses_unadmitted_nodes_so_a_many_identity_flood_gets_nowhere() -> None:
    receiver = strict()
    flood = [receiver.receive(sent(group(f"sybil-{i}", i % 8), NodeKey.generate())) for i in range(20)]
    assert flood == ["unknown_key"] * 20
    assert receiver.arrivals == []


def test_tofu_pins_at_most_max_pinned_nodes_identities() -> None:
    receiver = Receiver(TrustStore(tofu=True, max_pinned_nodes=3))
    verdicts = [receiver.receive(sent(group(f"sybil-{i}", i % 8), NodeKey.generate())) for i in range(6)]
    assert [isinstance(v, Scored) for v in verdicts[:3]] == [True] * 3
    assert verdicts[3:] == ["pin_limit"] * 3
    assert receiver.arrivals == ["sybil-0", "sybil-1", "sybil-2"]


def test_without_identity_headers_and_body_must_still_agree() -> None:
    receiver = Receiver(None)
    assert isinstance(receiver.receive(sent(group("peer-1"), None)), Scored)
    assert receiver.refused(sent(group("peer-1", 1), None, {"node": "peer-2"})) == "identity_mismatch"
    headers, value = sent(group("peer-1", 2), None)
    assert isinstance(receiver.receive(({k: v for k, v in headers.items() if k != H_NODE}, value)), Scored)
    assert receiver.arrivals == ["peer-1", "peer-1"]


def test_without_identity_the_node_header_its_caller_read_is_the_sender() -> None:
    headers, value = sent(group("peer-1"), None)

    def sender(hs: Mapping[str, bytes], claimed: str | None = None) -> Sender | str:
        return sender_of(hs, value, "external", node_id=NODE, store=None, now_s=time.time(), claimed=claimed)

    assert sender(headers, "peer-1") == sender(headers) == Sender("peer-1")
    no_node = {k: v for k, v in headers.items() if k != H_NODE}
    assert sender(no_node, "") == sender(no_node) == Sender("")
    # A claim that is no node id names nobody: refused (dead-lettered), never a peer to count.
    for claim in ("peer-1\u202e", "Peer-1", "p" * 100_000):
        bad = headers | {H_NODE: claim.encode()}
        for claimed in (None, claim):
            with pytest.raises(InvalidMessageError) as info:
                sender(bad, claimed)
            assert info.value.reason == "bad_node_id"
