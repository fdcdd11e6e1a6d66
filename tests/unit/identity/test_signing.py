"""What a group signature covers: payload and routing headers, bound together."""

from __future__ import annotations

import pytest

from sapo import wire
from sapo.identity.keys import NodeKey
from sapo.identity.signing import (
    H_KEY_ID,
    H_PUBLIC_KEY,
    H_SIGNATURE,
    H_SIGNATURE_V2,
    Signer,
    decode_signature,
    signed_bytes,
)
from tests.factories import make_group

pytestmark = pytest.mark.unit


def test_signed_headers_carry_key_id_public_key_and_signature() -> None:
    key = NodeKey.generate()
    group = make_group(node_id="node-a")
    value = group.SerializeToString()
    headers = dict(Signer(key).sign_headers(wire.rollout_headers(group, value), value))
    assert headers[H_KEY_ID] == key.key_id.encode()
    assert headers[H_PUBLIC_KEY].decode() == key.public_text.removeprefix("ed25519:")
    signature = decode_signature(headers[H_SIGNATURE])
    assert signature is not None
    key.public.verify(signature, signed_bytes(headers, value))
    v2 = decode_signature(headers[H_SIGNATURE_V2])
    assert v2 is not None
    key.public.verify(v2, signed_bytes(headers, value, facts=True))
    assert headers[wire.H_NODE] == b"node-a"


@pytest.mark.parametrize("facts", [False, True], ids=["v1", "v2"])
def test_every_signed_header_and_the_payload_change_the_signed_bytes(facts: bool) -> None:
    headers = {
        wire.H_TYPE: b"RolloutGroup",
        wire.H_NODE: b"node-a",
        wire.H_TASK: b"t",
        wire.H_SCHEMA: b"1",
        H_KEY_ID: b"k",
    } | ({wire.H_FACTS: b"f1;facts"} if facts else {})
    base = signed_bytes(headers, b"payload", facts=facts)
    for name, field in headers.items():
        assert signed_bytes(headers | {name: field + b"x"}, b"payload", facts=facts) != base, name
        removed = {k: v for k, v in headers.items() if k != name}
        assert signed_bytes(removed, b"payload", facts=facts) != base, name
    assert signed_bytes(headers, b"payload!", facts=facts) != base
    # Length prefixes: moving bytes from one header into the next never gives the same string.
    shifted = headers | {wire.H_NODE: b"node-at", wire.H_TASK: b""}
    assert signed_bytes(shifted, b"payload", facts=facts) != signed_bytes(
        headers | {wire.H_TASK: b"t"}, b"payload", facts=facts
    )


def test_v1_leaves_the_facts_out_and_v2_is_another_domain() -> None:
    """v1 is the layout receivers that predate the facts signature verify; v2's own domain tag keeps
    either signature from verifying as the other."""
    headers = {wire.H_NODE: b"node-a", wire.H_FACTS: b"f1;facts"}
    assert signed_bytes(headers | {wire.H_FACTS: b"f1;other"}, b"v") == signed_bytes(headers, b"v")
    assert signed_bytes({wire.H_NODE: b"node-a"}, b"v", facts=True) != signed_bytes(
        {wire.H_NODE: b"node-a"}, b"v"
    )


def test_unsigned_headers_do_not_change_the_signed_bytes() -> None:
    headers = {wire.H_NODE: b"node-a"}
    assert signed_bytes(headers | {"x-trace": b"1"}, b"v") == signed_bytes(headers, b"v")


@pytest.mark.parametrize("text", [b"", b"!!", b"AAAA"])
def test_malformed_signatures_decode_to_none(text: bytes) -> None:
    assert decode_signature(text) is None
