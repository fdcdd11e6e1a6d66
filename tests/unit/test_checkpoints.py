"""Checkpoint store: atomic versions, digests verified on load, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapo.checkpoints import CheckpointError, CheckpointStore, load_extra, load_weights, read_manifest

pytestmark = pytest.mark.unit


def _state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 3, generator=gen), "b.bias": torch.randn(5, generator=gen)}


def test_round_trip_with_extras_and_shards(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    state = _state(0)
    written = store.write("n1", 1, state, base_model="tiny:0", extras={"trainer.pt": b"abc"}, shard_bytes=16)
    manifest, directory = read_manifest(written.manifest_uri, written.manifest_sha256)
    assert manifest.version == 1
    assert len(manifest.weights) == 2  # shard limit forces one file per tensor
    loaded = load_weights(manifest, directory)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert load_extra(manifest, directory, "trainer.pt") == b"abc"
    assert not [p for p in (tmp_path / "n1").iterdir() if p.name.startswith(".tmp")]


def test_corruption_and_substitution_are_detected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    written = store.write("n1", 1, _state(0), base_model="tiny:0")
    with pytest.raises(CheckpointError, match="manifest digest mismatch"):
        read_manifest(written.manifest_uri, "0" * 64)
    manifest, directory = read_manifest(written.manifest_uri, written.manifest_sha256)
    shard = directory / manifest.weights[0].name
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_weights(manifest, directory)


def test_keeps_last_k_and_refuses_overwrite(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=2)
    for version in range(1, 5):
        store.write("n1", version, _state(version), base_model="tiny:0")
    assert store.versions("n1") == [3, 4]
    latest = store.latest("n1")
    assert latest is not None and latest.directory.name == "v00000004"
    with pytest.raises(CheckpointError, match="already exists"):
        store.write("n1", 4, _state(9), base_model="tiny:0")
