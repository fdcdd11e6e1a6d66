"""The receiver's trust store: every hostile case refused by its reason, TOFU pinning, rotation
overlap, revocation and the announcement rules."""

from __future__ import annotations

import pytest

from sapo import wire
from sapo.identity.announce import add_statement, announcement, record_key, revoke_statement
from sapo.identity.keys import NodeKey
from sapo.identity.signing import H_KEY_ID, H_PUBLIC_KEY, H_SIGNATURE, H_SIGNATURE_V2, Signer
from sapo.identity.trust import HOSTILE, IDENTITY_REASONS, Rejection, Sender, TrustStore
from tests.factories import make_group
from tests.unit.identity.helpers import NOW, admit, revoke, rotate, signed

pytestmark = pytest.mark.unit

A, B = NodeKey.generate(), NodeKey.generate()


def strict(**keys: NodeKey) -> TrustStore:
    store = TrustStore()
    for node, key in keys.items():
        store.add(node.replace("_", "-"), key.public, "file")
    return store


def reason(result: Sender | Rejection) -> str:
    assert isinstance(result, Rejection), result
    return result.reason


def test_a_listed_key_identifies_its_node() -> None:
    store = strict(node_a=A)
    assert store.identify(*signed("node-a", A), NOW) == Sender("node-a", A.key_id)


def test_unsigned_and_nameless_messages_are_refused() -> None:
    store = strict(node_a=A)
    headers, value = signed("node-a", A)
    unsigned = {k: v for k, v in headers.items() if k not in {H_SIGNATURE, H_SIGNATURE_V2}}
    assert reason(store.identify(unsigned, value, NOW)) == "unsigned"
    assert (
        reason(store.identify({k: v for k, v in headers.items() if k != H_KEY_ID}, value, NOW)) == "unsigned"
    )
    nameless = {k: v for k, v in headers.items() if k != wire.H_NODE}
    assert reason(store.identify(nameless, value, NOW)) == "missing_node_id"


def test_impersonation_with_a_valid_signature_of_another_node_is_an_identity_mismatch() -> None:
    store = strict(node_a=A, node_b=B)
    assert reason(store.identify(*signed("node-a", B), NOW)) == "identity_mismatch"


def test_a_forged_key_for_a_known_node_is_a_key_conflict() -> None:
    mallory = NodeKey.generate()
    assert reason(strict(node_a=A).identify(*signed("node-a", mallory), NOW)) == "key_conflict"


def test_a_forged_signature_under_a_listed_key_id_is_a_bad_signature() -> None:
    mallory = NodeKey.generate()
    headers, value = signed("node-a", mallory)
    headers[H_KEY_ID] = A.key_id.encode()  # claims A's key; signed by another
    assert reason(strict(node_a=A).identify(headers, value, NOW)) == "bad_signature"
    headers[H_SIGNATURE] = b"not base64 at all"
    assert reason(strict(node_a=A).identify(headers, value, NOW)) == "bad_signature"


def test_headers_moved_onto_another_body_or_edited_break_the_signature() -> None:
    store = strict(node_a=A)
    headers, _value = signed("node-a", A)
    _other_headers, other_value = signed("node-a", A)
    assert reason(store.identify(headers, other_value, NOW)) == "bad_signature"
    headers, value = signed("node-a", A)
    assert reason(store.identify(headers | {wire.H_TASK: b"other_task"}, value, NOW)) == "bad_signature"
    assert reason(store.identify(headers | {wire.H_SCHEMA: b"2"}, value, NOW)) == "bad_signature"


def test_a_replayed_group_with_edited_facts_breaks_the_signature() -> None:
    """A lazy sampler pools a group on its facts header (id, round, date, claimed signal) before it
    decodes the body: anyone copying node-a's signed record must not restate it as another group."""
    group = make_group(node_id="node-a")
    value = group.SerializeToString()
    headers = dict(wire.rollout_headers(group, value, Signer(A)))
    sender = strict(node_a=A).identify(headers, value, NOW)
    assert sender == Sender("node-a", A.key_id) and sender.facts_signed
    fresh_id = "00000000-0000-4000-8000-000000000001"
    lie = wire.group_facts(group)._replace(group_id=fresh_id, round=group.round + 1, signal=True)
    edited = headers | {wire.H_FACTS: wire.encode_facts(lie)}
    assert reason(strict(node_a=A).identify(edited, value, NOW)) == "bad_signature"
    # With the v2 signature stripped, v1 still names node-a (an older signer's record reads the same),
    # but nothing vouches for the facts: the sampler sets them aside and decodes the body.
    stripped = strict(node_a=A).identify({k: v for k, v in edited.items() if k != H_SIGNATURE_V2}, value, NOW)
    assert stripped == Sender("node-a", A.key_id) and not stripped.facts_signed


def test_strict_refuses_unknown_nodes_without_dead_lettering_them() -> None:
    result = strict(node_a=A).identify(*signed("node-c", NodeKey.generate()), NOW)
    assert reason(result) == "unknown_key"
    assert isinstance(result, Rejection) and not result.hostile


def test_revoked_keys_are_refused() -> None:
    store = strict(node_a=A)
    store.revoke(A.key_id)
    assert reason(store.identify(*signed("node-a", A), NOW)) == "revoked_key"


def test_hostile_reasons_are_identity_reasons() -> None:
    assert set(HOSTILE) <= set(IDENTITY_REASONS)
    assert {"unknown_key", "retired_key", "pin_limit"}.isdisjoint(HOSTILE)


# --- open swarm: trust on first use ---


def test_tofu_pins_the_first_key_of_a_node_and_refuses_contradicting_ones() -> None:
    store = TrustStore(tofu=True)
    assert store.identify(*signed("node-a", A), NOW) == Sender("node-a", A.key_id)
    assert [e.key_id for e in store.take_new_pins()] == [A.key_id]
    assert store.identify(*signed("node-a", A), NOW) == Sender("node-a", A.key_id)
    assert store.take_new_pins() == []
    assert reason(store.identify(*signed("node-a", B), NOW)) == "key_conflict"
    # a pinned key is bound to its node: it cannot speak for a second one
    assert reason(store.identify(*signed("node-b", A), NOW)) == "identity_mismatch"


def test_tofu_pins_only_a_public_key_that_matches_the_key_id_and_signature() -> None:
    store = TrustStore(tofu=True)
    headers, value = signed("node-a", A)
    swapped = headers | {H_PUBLIC_KEY: signed("node-b", B)[0][H_PUBLIC_KEY]}
    assert reason(store.identify(swapped, value, NOW)) == "bad_signature"
    assert reason(store.identify({k: v for k, v in headers.items() if k != H_PUBLIC_KEY}, value, NOW)) == (
        "bad_signature"
    )
    _, other_value = signed("node-a", A)
    assert reason(store.identify(headers, other_value, NOW)) == "bad_signature"
    assert len(store) == 0


def test_tofu_never_pins_a_name_that_is_no_node_id() -> None:
    """A node id followed by a newline once passed the `^...$` pattern (Python's `$` matches before a
    final newline), and would have been pinned, counted and put in topic names."""
    store = TrustStore(tofu=True)
    assert reason(store.identify(*signed("node-a\n", A), NOW)) == "bad_node_id"
    assert store.take_new_pins() == []


def test_tofu_stops_pinning_at_its_limit() -> None:
    store = TrustStore(tofu=True, max_pinned_nodes=2)
    for i in range(2):
        assert isinstance(store.identify(*signed(f"node-{i}", NodeKey.generate()), NOW), Sender)
    assert reason(store.identify(*signed("node-9", NodeKey.generate()), NOW)) == "pin_limit"


def test_tofu_never_repins_a_node_whose_keys_were_revoked() -> None:
    store = TrustStore(tofu=True)
    store.identify(*signed("node-a", A), NOW)
    assert store.apply(revoke("node-a", A.key_id, A), NOW) == "revoked"
    assert reason(store.identify(*signed("node-a", B), NOW)) == "key_conflict"


def test_tofu_never_pins_a_node_it_knows_only_by_a_revocation() -> None:
    """A key pinned from its groups is on no record but its revocation, and a restarted receiver's
    pins no longer hold a revoked key: whoever stole it must not claim its node with a key of their
    own."""
    fresh = TrustStore(tofu=True)
    assert fresh.apply(revoke("node-a", A.key_id, A), NOW) == "revoked"
    assert reason(fresh.identify(*signed("node-a", B), NOW)) == "key_conflict"
    assert fresh.apply(admit("node-a", B), NOW) == "key_conflict"


# --- announcements ---


def test_admission_needs_an_admin_signature_in_strict_mode() -> None:
    admin = NodeKey.generate()
    store = TrustStore(admins=[admin.public])
    assert store.apply(admit("node-a", A), NOW) == "unknown_key"
    assert store.apply(admit("node-a", A, admin), NOW) == "added"
    assert store.apply(admit("node-a", A, admin), NOW) == "unchanged"
    assert store.identify(*signed("node-a", A), NOW) == Sender("node-a", A.key_id)
    # an admin cannot give one key to two nodes
    assert store.apply(admit("node-b", A, admin), NOW) == "identity_mismatch"


def test_an_admin_vouches_for_a_public_key_anyone_else_must_prove_possession() -> None:
    from sapo.identity.announce import add_statement, announcement

    admin = NodeKey.generate()
    store = TrustStore(admins=[admin.public], tofu=True)
    assert store.apply(announcement(add_statement("node-a", A.public, NOW), [admin]), NOW) == "added"
    mallory = NodeKey.generate()  # in an open swarm, pinning B's key needs B's signature
    assert (
        store.apply(announcement(add_statement("node-b", B.public, NOW), [mallory]), NOW) == "bad_signature"
    )
    assert store.apply(announcement(add_statement("node-b", B.public, NOW), [B]), NOW) == "pinned"


def test_tofu_pins_a_self_signed_announcement_for_a_new_node_only() -> None:
    store = TrustStore(tofu=True)
    assert store.apply(admit("node-a", A), NOW) == "pinned"
    assert store.apply(admit("node-a", B), NOW) == "key_conflict"


def test_rotation_keeps_both_keys_valid_for_the_overlap_then_retires_the_old_one() -> None:
    store = strict(node_a=A)
    assert store.apply(rotate("node-a", A, B, overlap_s=60), NOW) == "rotated"
    assert store.identify(*signed("node-a", A), NOW + 59) == Sender("node-a", A.key_id)
    assert store.identify(*signed("node-a", B), NOW + 59) == Sender("node-a", B.key_id)
    assert reason(store.identify(*signed("node-a", A), NOW + 60)) == "retired_key"
    assert store.identify(*signed("node-a", B), NOW + 60) == Sender("node-a", B.key_id)
    # read again after a restart: nothing changes
    assert store.apply(rotate("node-a", A, B, overlap_s=60), NOW + 61) == "unchanged"


def test_a_key_signs_one_rotation_so_a_stolen_old_key_cannot_fork_the_node() -> None:
    store = strict(node_a=A)
    assert store.apply(rotate("node-a", A, B, overlap_s=3600), NOW) == "rotated"
    thief = NodeKey.generate()
    assert store.apply(rotate("node-a", A, thief, overlap_s=3600), NOW + 1) == "key_conflict"
    assert reason(store.identify(*signed("node-a", thief), NOW + 2)) == "key_conflict"


def test_rotation_must_be_signed_by_the_current_key_of_the_same_node() -> None:
    from sapo.identity.announce import add_statement, announcement

    store = strict(node_a=A, node_b=B)
    new = NodeKey.generate()
    unsigned_by_old = announcement(
        add_statement("node-a", new.public, NOW, previous_key_id=A.key_id, overlap_s=60), [new]
    )
    assert store.apply(unsigned_by_old, NOW) == "bad_signature"
    assert store.apply(rotate("node-a", B, new, overlap_s=60), NOW) == "identity_mismatch"
    assert store.apply(rotate("node-c", NodeKey.generate(), new, overlap_s=60), NOW) == "unknown_key"


def test_chained_rotations_replay_in_order() -> None:
    C = NodeKey.generate()  # noqa: N806
    store = strict(node_a=A)
    assert store.apply(rotate("node-a", A, B, overlap_s=10), NOW) == "rotated"
    assert store.apply(rotate("node-a", B, C, overlap_s=10, now=NOW + 100), NOW + 100) == "rotated"
    assert reason(store.identify(*signed("node-a", A), NOW + 100)) == "retired_key"
    assert isinstance(store.identify(*signed("node-a", B), NOW + 105), Sender)
    assert isinstance(store.identify(*signed("node-a", C), NOW + 200), Sender)
    assert reason(store.identify(*signed("node-a", B), NOW + 200)) == "retired_key"


def compacted(log: list[tuple[bytes, bytes]]) -> list[bytes]:
    """What a compacted topic keeps of `log`: each record key's last record, in offset order."""
    last = {key: offset for offset, (key, _) in enumerate(log)}
    return [value for offset, (key, value) in enumerate(log) if last[key] == offset]


def test_revoking_a_rotated_in_key_keeps_the_key_it_retired_retired_after_compaction() -> None:
    """The rotation that retired A is B's record: B's revocation must not compact it away, or a
    receiver reading the topic later trusts A again, and A's holder may rotate the node anew."""
    admin = NodeKey.generate()
    admission = add_statement("node-a", A.public, NOW)
    rotation = add_statement("node-a", B.public, NOW, previous_key_id=A.key_id, overlap_s=60)
    revocation = revoke_statement("node-a", B.key_id, NOW + 100, admin)
    log = [
        (record_key(admission), announcement(admission, [A, admin])),
        (record_key(rotation), announcement(rotation, [B, A])),
        (record_key(revocation), announcement(revocation, [admin])),
    ]
    fresh = TrustStore(admins=[admin.public])
    for value in compacted(log):
        fresh.apply(value, NOW + 200)
    assert reason(fresh.identify(*signed("node-a", B), NOW + 200)) == "revoked_key"
    assert reason(fresh.identify(*signed("node-a", A), NOW + 200)) == "retired_key"
    assert fresh.apply(rotate("node-a", A, NodeKey.generate(), 60, NOW + 200), NOW + 200) == "key_conflict"


def test_revocation_by_the_key_itself_or_an_admin_only() -> None:
    admin = NodeKey.generate()
    store = TrustStore(admins=[admin.public])
    store.add("node-a", A.public, "file")
    store.add("node-b", B.public, "file")
    assert store.apply(revoke("node-a", A.key_id, B), NOW) == "bad_signature"
    assert store.apply(revoke("node-a", A.key_id, A), NOW) == "revoked"
    assert store.apply(revoke("node-a", A.key_id, A), NOW) == "unchanged"
    # a receiver that never knew the key (pinned from its groups elsewhere) still applies it
    fresh = TrustStore()
    assert fresh.apply(revoke("node-a", A.key_id, A), NOW) == "revoked"
    assert reason(fresh.identify(*signed("node-a", A), NOW)) == "revoked_key"
    assert store.apply(revoke("node-b", B.key_id, admin), NOW) == "revoked"
    assert reason(store.identify(*signed("node-a", A), NOW)) == "revoked_key"
    assert reason(store.identify(*signed("node-b", B), NOW)) == "revoked_key"
    admin_again = admit("node-a", A, admin)
    assert store.apply(admin_again, NOW) == "revoked_key"


@pytest.mark.parametrize("value", [None, b"", b"\xff\xff\xff", b"x" * 20_000])
def test_garbage_on_the_keys_topic_is_a_bad_statement(value: bytes | None) -> None:
    assert TrustStore().apply(value, NOW) == "bad_statement"
