"""The nested identity settings: start-up errors that say what to set, and what each mode builds."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sapo.identity.keys import IdentityError, NodeKey, write_private
from sapo.identity.settings import IdentitySettings
from sapo.identity.trust import Sender, TrustMode
from sapo.identity.trustlist import TrustList, save_trust_list
from tests.unit.identity.helpers import NOW, signed

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trust_file": "t.yaml"}, "set IDENTITY__MODE=strict"),
        ({"keys_topic": True}, "set IDENTITY__MODE=strict"),
        (
            {"mode": "strict", "trust_file": "t.yaml", "pins_file": "p.yaml"},
            "only applies to IDENTITY__MODE=tofu",
        ),
        ({"private_key_file": "k", "private_key": "pem"}, "not both"),
        ({"mode": "paranoid"}, "'off', 'strict' or 'tofu'"),
    ],
)
def test_contradictions_fail_at_start_saying_what_to_set(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        IdentitySettings.model_validate(fields)


def test_off_without_a_key_neither_signs_nor_verifies() -> None:
    settings = IdentitySettings()
    assert settings.signer() is None
    assert settings.store() is None


def test_a_verifying_node_must_sign(tmp_path: Path) -> None:
    settings = IdentitySettings(mode=TrustMode.TOFU)
    with pytest.raises(IdentityError, match="set IDENTITY__PRIVATE_KEY_FILE"):
        settings.signer()


def test_key_from_a_file_or_from_the_environment(tmp_path: Path) -> None:
    key = NodeKey.generate()
    write_private(tmp_path / "node.key", key)
    from_file = IdentitySettings(private_key_file=tmp_path / "node.key").signer()
    from_env = IdentitySettings.model_validate({"private_key": key.pem().decode()}).signer()
    assert from_file is not None and from_env is not None
    assert from_file.key_id == from_env.key_id == key.key_id
    assert "PRIVATE KEY" not in repr(IdentitySettings.model_validate({"private_key": key.pem().decode()}))
    with pytest.raises(IdentityError, match="IDENTITY__PRIVATE_KEY: not an unencrypted PEM"):
        IdentitySettings.model_validate({"private_key": "garbage"}).signer()


def test_a_strict_receiver_needs_a_trust_list_a_strict_signer_does_not(tmp_path: Path) -> None:
    key = NodeKey.generate()
    write_private(tmp_path / "node.key", key)
    settings = IdentitySettings(mode=TrustMode.STRICT, private_key_file=tmp_path / "node.key")
    assert settings.signer() is not None
    with pytest.raises(IdentityError, match="set IDENTITY__TRUST_FILE"):
        settings.store()


def test_strict_store_from_the_trust_file(tmp_path: Path) -> None:
    key = NodeKey.generate()
    path = tmp_path / "trust.yaml"
    save_trust_list(path, TrustList().with_key("node-a", key.public_text))
    store = IdentitySettings(mode=TrustMode.STRICT, trust_file=path).store()
    assert store is not None and not store.tofu
    assert store.identify(*signed("node-a", key), NOW) == Sender("node-a", key.key_id)
    path.write_text("nodes: {node-a: [bad]}")
    with pytest.raises(IdentityError, match=r"trust\.yaml"):
        IdentitySettings(mode=TrustMode.STRICT, trust_file=path).store()


def test_tofu_store_reads_earlier_pins(tmp_path: Path) -> None:
    key = NodeKey.generate()
    pins = tmp_path / "pins.yaml"
    settings = IdentitySettings(mode=TrustMode.TOFU, pins_file=pins)
    store = settings.store()
    assert store is not None and store.tofu and len(store) == 0  # no pins file yet: empty
    save_trust_list(pins, TrustList().with_key("node-a", key.public_text))
    again = settings.store()
    assert again is not None and again.get(key.key_id) is not None
