"""Versioned checkpoints: safetensors shards plus a manifest, written atomically, verified on load.

Layout under the store root: `<node_id>/v<version:08d>/{manifest.json, model-*.safetensors, ...}`.
A version directory is assembled under a temporary name and renamed into place, so readers never
see a half-written checkpoint; the manifest lists every file with its sha256 and the `PolicyUpdate`
carries the manifest's own sha256, so a loader detects any corruption or substitution before it
touches the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import torch
from safetensors.torch import load_file, save_file

MANIFEST = "manifest.json"
SHARD_BYTES = 2 * 1024**3
_VERSION_PREFIX = "v"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or does not match its recorded digests.

    `reason` is a bounded label for metrics: digest_mismatch, missing, malformed, unsupported, exists.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class FileEntry:
    name: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint contains; serialised as manifest.json beside the files."""

    node_id: str
    version: int
    base_model: str
    dtype: str
    created_at: float
    weights: tuple[FileEntry, ...]
    extras: tuple[FileEntry, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body = {
            "node_id": self.node_id,
            "version": self.version,
            "base_model": self.base_model,
            "dtype": self.dtype,
            "created_at": self.created_at,
            "weights": [vars(f) for f in self.weights],
            "extras": [vars(f) for f in self.extras],
            "meta": dict(self.meta),
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            body = json.loads(data)
            return cls(
                node_id=body["node_id"],
                version=int(body["version"]),
                base_model=body["base_model"],
                dtype=body["dtype"],
                created_at=float(body["created_at"]),
                weights=tuple(FileEntry(**f) for f in body["weights"]),
                extras=tuple(FileEntry(**f) for f in body.get("extras", [])),
                meta=body.get("meta", {}),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError("malformed", f"malformed manifest: {exc}") from None


@dataclass(frozen=True)
class Written:
    """Where a checkpoint landed: what a `PolicyUpdate` announces."""

    manifest_uri: str
    manifest_sha256: str
    directory: Path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _shards(state: Mapping[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        # safetensors refuses shared storage (tied embeddings) and non-contiguous views.
        shards[-1][name] = tensor.detach().to("cpu").contiguous().clone()
        size += nbytes
    return shards


class CheckpointStore:
    """A directory (or mounted volume) holding each node's versions; keeps the newest `keep_last`."""

    def __init__(self, root: Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1: the announced version must stay readable")
        self.root = root
        self.keep_last = keep_last

    def node_dir(self, node_id: str) -> Path:
        return self.root / node_id

    def versions(self, node_id: str) -> list[int]:
        base = self.node_dir(node_id)
        if not base.is_dir():
            return []
        found = [
            int(p.name[len(_VERSION_PREFIX) :])
            for p in base.iterdir()
            if p.name.startswith(_VERSION_PREFIX) and p.name[1:].isdigit() and (p / MANIFEST).is_file()
        ]
        return sorted(found)

    def write(
        self,
        node_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        *,
        base_model: str,
        extras: Mapping[str, bytes] | None = None,
        meta: Mapping[str, Any] | None = None,
        shard_bytes: int = SHARD_BYTES,
    ) -> Written:
        """Write weights (+ extra files such as trainer state) as one atomic version directory."""
        final = self.node_dir(node_id) / f"{_VERSION_PREFIX}{version:08d}"
        if final.exists():
            raise CheckpointError("exists", f"version {version} of {node_id} already exists at {final}")
        tmp = self.node_dir(node_id) / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        try:
            weights = []
            shards = _shards(state, shard_bytes)
            for i, shard in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / name))
                weights.append(FileEntry(name, sha256_file(tmp / name), (tmp / name).stat().st_size))
            extra_entries = []
            for name, data in (extras or {}).items():
                (tmp / name).write_bytes(data)
                extra_entries.append(FileEntry(name, hashlib.sha256(data).hexdigest(), len(data)))
            dtype = str(next(iter(state.values())).dtype).removeprefix("torch.") if state else "none"
            manifest = Manifest(
                node_id,
                version,
                base_model,
                dtype,
                time.time(),
                tuple(weights),
                tuple(extra_entries),
                meta or {},
            )
            data = manifest.to_json()
            (tmp / MANIFEST).write_bytes(data)
            _fsync_dir(tmp)
            os.rename(tmp, final)
            _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(node_id)
        return Written((final / MANIFEST).resolve().as_uri(), hashlib.sha256(data).hexdigest(), final)

    def _prune(self, node_id: str) -> None:
        for old in self.versions(node_id)[: -self.keep_last]:
            shutil.rmtree(self.node_dir(node_id) / f"{_VERSION_PREFIX}{old:08d}", ignore_errors=True)

    def latest(self, node_id: str) -> Written | None:
        versions = self.versions(node_id)
        if not versions:
            return None
        directory = self.node_dir(node_id) / f"{_VERSION_PREFIX}{versions[-1]:08d}"
        data = (directory / MANIFEST).read_bytes()
        return Written((directory / MANIFEST).resolve().as_uri(), hashlib.sha256(data).hexdigest(), directory)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        raise CheckpointError(
            "unsupported", f"unsupported checkpoint URI scheme {parsed.scheme!r} in {uri}; use file://"
        )
    return Path(unquote(parsed.path))


def read_manifest(uri: str, expected_sha256: str) -> tuple[Manifest, Path]:
    """Load and verify a manifest against the digest announced with it."""
    path = manifest_path(uri)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError("missing", f"cannot read manifest {uri}: {exc}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != expected_sha256:
        raise CheckpointError(
            "digest_mismatch", f"manifest digest mismatch for {uri}: {got} != {expected_sha256}"
        )
    return Manifest.from_json(data), path.parent


def _verified(directory: Path, entry: FileEntry) -> Path:
    path = directory / entry.name
    if not path.is_file():
        raise CheckpointError("missing", f"checkpoint file missing: {path}")
    got = sha256_file(path)
    if got != entry.sha256:
        raise CheckpointError(
            "digest_mismatch", f"checkpoint file corrupt: {path} sha256 {got} != {entry.sha256}"
        )
    return path


def load_weights(manifest: Manifest, directory: Path) -> dict[str, torch.Tensor]:
    """All weight shards, each verified against its manifest digest before it is parsed."""
    state: dict[str, torch.Tensor] = {}
    for entry in manifest.weights:
        state.update(load_file(str(_verified(directory, entry))))
    return state


def load_extra(manifest: Manifest, directory: Path, name: str) -> bytes:
    entry = next((e for e in manifest.extras if e.name == name), None)
    if entry is None:
        raise CheckpointError("missing", f"checkpoint v{manifest.version} has no {name}")
    return _verified(directory, entry).read_bytes()
