"""The trust list file (a ConfigMap on Kubernetes) and the store built from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo.identity.keys import IdentityError, NodeKey
from sapo.identity.trust import Rejection, Sender
from sapo.identity.trustlist import (
    TrustList,
    build_store,
    load_trust_list,
    parse_trust_list,
    save_pins,
    save_trust_list,
)
from tests.unit.identity.helpers import NOW, admit, signed

pytestmark = pytest.mark.unit

A, B, ADMIN = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()


def test_yaml_round_trip_and_json_is_read_too(tmp_path: Path) -> None:
    trust = TrustList().with_key("node-a", A.public_text).with_key("node-a", B.public_text)
    trust = trust.with_admin(ADMIN.public_text)
    path = tmp_path / "trust.yaml"
    save_trust_list(path, trust)
    assert load_trust_list(path) == trust
    as_json = tmp_path / "trust.json"
    as_json.write_text(json.dumps(trust.model_dump(mode="json")))
    assert load_trust_list(as_json) == trust


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("nodes: {Node_A: [x]}", "invalid node id"),
        ("nodes: {node-a: []}", "lists no key"),
        ("nodes: {node-a: ['ed25519:AAAA']}", "32 bytes"),
        ("admins: [rsa-key]", "must start with 'ed25519:'"),
        ("revoked: [nothex]", "not key ids"),
        ("extra: 1", "Extra inputs are not permitted"),
        ("nodes: [", "not YAML or JSON"),
    ],
)
def test_bad_trust_lists_fail_naming_the_file_and_the_problem(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "trust.yaml"
    path.write_text(content)
    with pytest.raises(IdentityError, match=message) as info:
        load_trust_list(path)
    assert str(path) in str(info.value)


def test_one_key_cannot_belong_to_two_nodes_nor_be_listed_and_revoked() -> None:
    trust = TrustList().with_key("node-a", A.public_text)
    with pytest.raises(IdentityError, match="listed for both node-a and node-b"):
        trust.with_key("node-b", A.public_text)
    with pytest.raises(IdentityError, match="both listed and revoked"):
        parse_trust_list({"nodes": {"node-a": [A.public_text]}, "revoked": [A.key_id]})


def test_removing_a_key_retires_it_and_revoking_adds_it_to_revoked() -> None:
    trust = TrustList().with_key("node-a", A.public_text).with_key("node-a", B.public_text)
    assert trust.without_key(A.key_id).nodes == {"node-a": (B.public_text,)}
    revoked = trust.without_key(A.key_id, revoke=True).without_key(B.key_id)
    assert revoked.nodes == {}
    assert revoked.revoked == (A.key_id,)


def test_missing_file_fails_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match=r"cannot read trust list .*nope\.yaml"):
        load_trust_list(tmp_path / "nope.yaml")


def test_store_from_a_trust_list_with_admins_and_revocations() -> None:
    trust = TrustList.model_validate(
        {"admins": [ADMIN.public_text], "nodes": {"node-a": [A.public_text]}, "revoked": [B.key_id]}
    )
    store = build_store(trust, tofu=False, max_pinned_nodes=10)
    assert store.identify(*signed("node-a", A), NOW) == Sender("node-a", A.key_id)
    assert store.is_revoked(B.key_id)
    node_c = NodeKey.generate()
    assert store.apply(admit("node-c", node_c, ADMIN), NOW) == "added"


def test_pins_survive_a_restart_through_the_pins_file(tmp_path: Path) -> None:
    store = build_store(TrustList(), tofu=True, max_pinned_nodes=1)
    assert isinstance(store.identify(*signed("node-a", A), NOW), Sender)
    pins = tmp_path / "pins.yaml"
    save_pins(pins, store)
    restarted = build_store(TrustList(), tofu=True, max_pinned_nodes=1, pins=load_trust_list(pins))
    result = restarted.identify(*signed("node-a", B), NOW)
    assert isinstance(result, Rejection) and result.reason == "key_conflict"
    # the pin counts against the limit after the restart as well
    other = restarted.identify(*signed("node-b", B), NOW)
    assert isinstance(other, Rejection) and other.reason == "pin_limit"


def test_a_pin_that_the_trust_list_now_gives_to_another_node_fails_at_start() -> None:
    pins = TrustList().with_key("node-a", A.public_text)
    trust = TrustList().with_key("node-b", A.public_text)
    with pytest.raises(IdentityError, match="is node-b's, not node-a's"):
        build_store(trust, tofu=True, max_pinned_nodes=10, pins=pins)


def test_the_trust_list_overrules_an_earlier_pin_of_a_node_it_lists() -> None:
    """Someone pinned node-a first; its operator lists node-a's own key: the squatter's pin is gone
    after the restart that reads the list, as it would be without a pins file."""
    node_c = NodeKey.generate()
    pins = TrustList().with_key("node-a", B.public_text).with_key("node-c", node_c.public_text)
    trust = TrustList().with_key("node-a", A.public_text)
    store = build_store(trust, tofu=True, max_pinned_nodes=10, pins=pins)
    assert store.identify(*signed("node-a", A), NOW) == Sender("node-a", A.key_id)
    result = store.identify(*signed("node-a", B), NOW)
    assert isinstance(result, Rejection) and result.reason == "key_conflict"
    assert store.identify(*signed("node-c", node_c), NOW) == Sender("node-c", node_c.key_id)


def test_a_trust_list_that_is_not_utf8_text_says_so(tmp_path: Path) -> None:
    """It ended `sapo keys trust` and a sampler's start in a UnicodeDecodeError traceback."""
    path = tmp_path / "trust.yaml"
    path.write_bytes(b"\xff\xfe nodes: {}")
    with pytest.raises(IdentityError, match=f"^trust list {path} is not UTF-8 text"):
        load_trust_list(path)
