"""Versioned checkpoints in any store fsspec speaks: policy versions for generators, full states for resume.

Layout under the store (a path, `file://`, `s3://bucket/prefix`, ...; see `sapo.storage`):

    <node_id>/v<version:08d>/manifest.json      a policy version: what generators read
                             model-00001-of-0000N.safetensors
                             trainer_state.pt   a full trainer state at this version (every k versions)
                             state.json         ... which exists only once that state is complete

Policy versions carry only what a generator needs: the weights, with tied tensors stored once (the
manifest lists the aliases and `load_weights` re-links them). The trainer's full state (optimizer,
schedule, RNG, input offsets, ledger: `sapo.trainer.state`) is written beside a version every
`state_every` versions and on shutdown; it names the sha256 of the version's manifest, so a state can
only be resumed with the weights it belongs to.

Atomicity: a version is visible once its manifest exists and a state once its `state.json` exists;
both are written last and list every file they cover with its digest. Locally a version is assembled
in a temporary directory and renamed into place; object stores have no rename, so files are uploaded
under the final prefix first and the manifest after them: a reader that finds the manifest finds a
complete version. Deletion removes the manifest (and state record) first. Durability (local stores):
a policy version's files are not fsynced when it is published (that cost ~1 s per 135M version on
the lock-step critical path); writing a full state fsyncs the version's files, the state and its
record, so the state a trainer resumes from survives a host crash. A host crash can tear newer
versions; their digests expose it, and a replayed version whose manifest is unreadable, or whose local
weight files no longer match it, is rewritten.

A version number, once announced, always means the same weights. The trainer commits its input
offsets only with a full state, so after a crash it resumes from the newest state and replays the
batches since. Training replays deterministically (same weights, optimizer state, RNG and batches),
so a replayed version re-derives the weights already stored under its number: `publish` recomputes
the digests of the replayed weights, and when the version exists it compares them with the stored
ones and writes nothing ("verified"). Should they differ (non-deterministic kernels), the stored
weights win ("diverged"): the trainer loads them and goes on from there, so the number keeps its
meaning. A replayed version older than the newest stored one that no longer exists (pruned, or never
written because `checkpoint_every` skipped it) is not written again ("skipped"): generators never go
back to it. Pruning keeps the newest `keep_last` versions and the version of the newest full state.

Digests: every file's digest is computed while it is written and checked while it is read, by the
algorithm the manifest names (`sapo.digests`; manifests without one are format 1 and use sha256).
`PolicyUpdate.manifest_sha256` pins the manifest itself.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch

from sapo import storage
from sapo.digests import DEFAULT, SHA256, Hashing, sha256_hex
from sapo.storage import CheckpointError, FileEntry, Location
from sapo.tensorfile import TensorFileError, dedupe, parse_tensors, restore_ties, write_tensors

__all__ = [
    "MANIFEST",
    "SHARD_BYTES",
    "STATE_RECORD",
    "TRAINER_STATE",
    "CheckpointError",
    "CheckpointStore",
    "FileEntry",
    "Manifest",
    "Outcome",
    "Published",
    "StateRecord",
    "Written",
    "load_weights",
    "read_manifest",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATE_RECORD = "state.json"
TRAINER_STATE = "trainer_state.pt"
SHARD_BYTES = 2 * 1024**3
FORMAT = 2
_VERSION_PREFIX = "v"
_T = TypeVar("_T")


def _entries(items: list[dict[str, Any]]) -> tuple[FileEntry, ...]:
    return tuple(_entry(f) for f in items)


def _entry(item: dict[str, Any]) -> FileEntry:
    """One listed file; a name that is no plain file name of the version's directory (not text, a path
    reaching elsewhere, a NUL no file system takes: read as a store failing, retried) is refused here,
    before a reader joins it to the directory."""
    name, digest = item["name"], item.get("digest") or item["sha256"]  # format 1: "sha256"
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"file name {name!r} is not a plain file name")
    return FileEntry(name, digest, int(item["bytes"]))


def _entry_json(entries: tuple[FileEntry, ...]) -> list[dict[str, Any]]:
    return [{"name": e.name, "digest": e.digest, "bytes": e.bytes} for e in entries]


def _document(body: dict[str, Any]) -> bytes:
    return json.dumps({"format": FORMAT} | body, indent=1, sort_keys=True).encode()


def _parsed(data: bytes, what: str, build: Callable[[dict[str, Any]], _T]) -> _T:
    """`build(body)` of a JSON document; any missing or ill-typed field makes it malformed."""
    try:
        body = json.loads(data)
        fmt = int(body.get("format", 1))
        if fmt > FORMAT:
            raise CheckpointError("unsupported", f"{what} format {fmt}; this version reads <= {FORMAT}")
        return build(body)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # deep nesting
        raise CheckpointError("malformed", f"malformed {what}: {exc!r}") from None


@dataclass(frozen=True)
class Manifest:
    """What a policy version contains; serialised as manifest.json beside the files."""

    node_id: str
    version: int
    base_model: str
    dtype: str
    created_at: float
    weights: tuple[FileEntry, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    digest: str = DEFAULT
    extras: tuple[FileEntry, ...] = ()  # format 1 kept the trainer state here

    def to_json(self) -> bytes:
        return _document(
            {
                "digest": self.digest,
                "node_id": self.node_id,
                "version": self.version,
                "base_model": self.base_model,
                "dtype": self.dtype,
                "created_at": self.created_at,
                "weights": _entry_json(self.weights),
                "aliases": dict(self.aliases),
                "meta": dict(self.meta),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        def build(body: dict[str, Any]) -> Manifest:
            return cls(
                node_id=body["node_id"],
                version=int(body["version"]),
                base_model=body["base_model"],
                dtype=body["dtype"],
                created_at=float(body["created_at"]),
                weights=_entries(body["weights"]),
                aliases=dict(body.get("aliases", {})),
                meta=body.get("meta", {}),
                digest=str(body["digest"]) if "format" in body else SHA256,
                extras=_entries(body.get("extras", [])),
            )

        return _parsed(data, "manifest", build)


@dataclass(frozen=True)
class StateRecord:
    """A full trainer state beside a version; serialised as state.json, written after its files."""

    node_id: str
    version: int
    manifest_sha256: str
    created_at: float
    files: tuple[FileEntry, ...]
    digest: str = DEFAULT

    def to_json(self) -> bytes:
        return _document(
            {
                "digest": self.digest,
                "node_id": self.node_id,
                "version": self.version,
                "manifest_sha256": self.manifest_sha256,
                "created_at": self.created_at,
                "files": _entry_json(self.files),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> StateRecord:
        def build(body: dict[str, Any]) -> StateRecord:
            return cls(
                node_id=body["node_id"],
                version=int(body["version"]),
                manifest_sha256=body["manifest_sha256"],
                created_at=float(body["created_at"]),
                files=_entries(body["files"]),
                digest=str(body["digest"]),
            )

        return _parsed(data, "state record", build)


@dataclass(frozen=True)
class Written:
    """A stored policy version: what a `PolicyUpdate` announces."""

    manifest_uri: str
    manifest_sha256: str
    manifest: Manifest
    directory: Location


Outcome = Literal["written", "verified", "diverged", "skipped"]


@dataclass(frozen=True)
class Published:
    """What `CheckpointStore.publish` did; `written` is None only when it skipped the version."""

    outcome: Outcome
    written: Written | None


def _shards(tensors: Mapping[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach()
        size += nbytes
    return shards


def _shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _dtype(tensors: Mapping[str, torch.Tensor]) -> str:
    return str(next(iter(tensors.values())).dtype).removeprefix("torch.") if tensors else "none"


class CheckpointStore:
    """One trainer's versions and states under a store URL; see the module docstring."""

    def __init__(
        self,
        url: str | os.PathLike[str],
        keep_last: int = 3,
        *,
        digest: str = DEFAULT,
        storage_options: dict[str, Any] | None = None,
        shard_bytes: int = SHARD_BYTES,
    ) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1: the announced version must stay readable")
        Hashing(None, digest)  # an unknown algorithm fails here, at start
        self.root = storage.location(url, storage_options)
        self.keep_last = keep_last
        self.digest = digest
        self.shard_bytes = shard_bytes

    def node_dir(self, node_id: str) -> Location:
        return self.root / node_id

    def version_dir(self, node_id: str, version: int) -> Location:
        return self.node_dir(node_id) / f"{_VERSION_PREFIX}{version:08d}"

    def _numbered(self, node_id: str, record: str) -> list[int]:
        found = []
        for path in storage.glob(self.node_dir(node_id) / f"{_VERSION_PREFIX}*" / record):
            name = path.rstrip("/").split("/")[-2][len(_VERSION_PREFIX) :]
            if name.isdigit():
                found.append(int(name))
        return sorted(found)

    def versions(self, node_id: str) -> list[int]:
        """Versions whose manifest exists (complete ones), ascending."""
        return self._numbered(node_id, MANIFEST)

    def states(self, node_id: str) -> list[int]:
        """Versions that also hold a complete full trainer state, ascending."""
        return self._numbered(node_id, STATE_RECORD)

    def stored(self, node_id: str, version: int) -> Written:
        """Stored version `version` (CheckpointError(missing) when it is not there)."""
        directory = self.version_dir(node_id, version)
        data = storage.read_bytes(directory / MANIFEST)
        manifest = Manifest.from_json(data)
        return Written((directory / MANIFEST).uri(), sha256_hex(data), manifest, directory)

    def latest(self, node_id: str) -> Written | None:
        versions = self.versions(node_id)
        return self.stored(node_id, versions[-1]) if versions else None

    def latest_readable(self, node_id: str) -> Written | None:
        """The newest stored version whose manifest reads: a host crash can tear a newer one's (not
        fsynced), which a replay writes again (`_readable`)."""
        for version in reversed(self.versions(node_id)):
            try:
                return self.stored(node_id, version)
            except CheckpointError as exc:
                if exc.reason != "malformed":
                    raise
                log.warning("version %d of %s has an unreadable manifest (%s)", version, node_id, exc)
        return None

    # --- writing ---------------------------------------------------------------------------------------

    def publish(
        self,
        node_id: str,
        version: int,
        state: Mapping[str, torch.Tensor],
        *,
        base_model: str,
        meta: Mapping[str, Any] | None = None,
    ) -> Published:
        """Store the weights as policy version `version`, or verify them against the stored ones."""
        tensors, aliases = dedupe(state)
        shards = _shards(tensors, self.shard_bytes)
        stored = self.versions(node_id)
        existing = self._readable(node_id, version) if version in stored else None
        if existing is not None:
            same = _same_weights(existing.manifest, shards, aliases)
            return Published("verified" if same else "diverged", existing)
        if stored and version < stored[-1]:
            return Published("skipped", None)
        final = self.version_dir(node_id, version)
        if final.local:
            target = self.node_dir(node_id) / f".tmp-{uuid.uuid4().hex}"
            os.makedirs(target.path)
        else:
            target = final
        try:
            weights = tuple(
                storage.write_file(
                    target, _shard_name(i, len(shards)), _writer(s), self.digest, durable=False
                )
                for i, s in enumerate(shards)
            )
            manifest = Manifest(
                node_id,
                version,
                base_model,
                _dtype(tensors),
                time.time(),
                weights,
                aliases,
                meta or {},
                self.digest,
            )
            data = manifest.to_json()
            storage.write_file(target, MANIFEST, lambda out: out.write(data), self.digest, durable=False)
            if final.local:
                storage.fsync_dir(target.path)
                os.rename(target.path, final.path)
                storage.fsync_dir(self.node_dir(node_id).path)
        except BaseException:
            if final.local:
                storage.remove_tree(target)
            raise
        self.prune(node_id)
        return Published("written", Written((final / MANIFEST).uri(), sha256_hex(data), manifest, final))

    def _readable(self, node_id: str, version: int) -> Written | None:
        """A stored version, or None after deleting one a host crash tore: its manifest unreadable, or
        a local weight file that no longer matches it (`_torn`)."""
        problem: str | None
        try:
            written = self.stored(node_id, version)
        except CheckpointError as exc:
            if exc.reason != "malformed":
                raise
            problem = f"an unreadable manifest ({exc})"
        else:
            problem = _torn(written)
            if problem is None:
                return written
        log.warning("version %d of %s has %s: rewriting it", version, node_id, problem)
        storage.remove_tree(self.version_dir(node_id, version), first=(STATE_RECORD, MANIFEST))
        return None

    def save_state(self, node_id: str, version: int, produce: Callable[[Hashing], object]) -> bool:
        """Write a full trainer state beside stored version `version`; False if it already has one."""
        directory = self.version_dir(node_id, version)
        if storage.exists(directory / STATE_RECORD):
            return False
        manifest_sha256 = sha256_hex(storage.read_bytes(directory / MANIFEST))
        storage.make_durable(directory)  # the weights this state resumes with
        entry = storage.write_file(directory, TRAINER_STATE, produce, self.digest)
        record = StateRecord(node_id, version, manifest_sha256, time.time(), (entry,), self.digest)
        data = record.to_json()
        if directory.local:  # a rename makes the record appear whole
            partial = f".{STATE_RECORD}.{uuid.uuid4().hex}"
            storage.write_file(directory, partial, lambda out: out.write(data), self.digest)
            os.rename((directory / partial).path, (directory / STATE_RECORD).path)
            storage.fsync_dir(directory.path)
        else:
            storage.write_file(directory, STATE_RECORD, lambda out: out.write(data), self.digest)
        self.prune(node_id)
        return True

    def prune(self, node_id: str) -> None:
        """Delete versions outside the newest `keep_last`, except the newest full state's."""
        versions = self.versions(node_id)
        keep = set(versions[-self.keep_last :]) | set(self.states(node_id)[-1:])
        for version in versions:
            if version not in keep:
                storage.remove_tree(self.version_dir(node_id, version), first=(STATE_RECORD, MANIFEST))

    def remove_partial(self, node_id: str) -> None:
        """Delete what a writer killed mid-write left behind (one trainer owns a node's store)."""
        node = self.node_dir(node_id)
        complete = set(self.versions(node_id))
        for name in storage.listdir(node):
            number = name[len(_VERSION_PREFIX) :]
            incomplete = name.startswith(_VERSION_PREFIX) and number.isdigit() and int(number) not in complete
            if name.startswith(".tmp-") or incomplete:
                storage.remove_tree(node / name)

    # --- resuming --------------------------------------------------------------------------------------

    def load_state(self, node_id: str) -> tuple[Written, bytes] | None:
        """The newest full state (its version, and the verified bytes of its trainer state), if any."""
        states = self.states(node_id)
        if not states:
            latest = self.latest(node_id)
            if latest is not None and latest.manifest.extras:
                raise CheckpointError(
                    "unsupported",
                    f"the checkpoints under {self.node_dir(node_id).uri()} were written by an older sapo "
                    "(format 1) and hold no state this trainer resumes: point the checkpoint root at a "
                    "fresh location",
                )
            return None
        directory = self.version_dir(node_id, states[-1])
        record = StateRecord.from_json(storage.read_bytes(directory / STATE_RECORD))
        written = self.stored(node_id, states[-1])
        if written.manifest_sha256 != record.manifest_sha256:
            raise CheckpointError(
                "digest_mismatch",
                f"the state at {directory.uri()} belongs to other weights than its manifest",
            )
        (entry,) = record.files
        return written, bytes(storage.read_verified(directory, entry, record.digest, listed_in=STATE_RECORD))


def _writer(tensors: Mapping[str, torch.Tensor]) -> Callable[[Hashing], None]:
    return lambda out: write_tensors(out, tensors)


def _torn(written: Written) -> str | None:
    """Why a local version's weight files do not match its manifest, or None. They were not fsynced
    when published, so a host crash can lose them while the manifest survives; a replay compares its
    weights with the manifest only, and the full state written next would fsync the torn files under
    it. An object store's PUT is whole once it returns: nothing to read back there."""
    if not written.directory.local:
        return None
    for entry in written.manifest.weights:
        try:
            storage.read_verified(written.directory, entry, written.manifest.digest, listed_in=MANIFEST)
        except CheckpointError as exc:
            if exc.reason not in ("digest_mismatch", "missing"):
                raise
            return f"a torn weight file ({exc})"
    return None


def _same_weights(
    manifest: Manifest, shards: list[dict[str, torch.Tensor]], aliases: Mapping[str, str]
) -> bool:
    """Whether `shards` serialise to exactly the files `manifest` lists (digests in its own algorithm)."""
    if len(shards) != len(manifest.weights) or dict(aliases) != dict(manifest.aliases):
        return False
    for index, (shard, entry) in enumerate(zip(shards, manifest.weights, strict=True)):
        sink = Hashing(None, manifest.digest)
        write_tensors(sink, shard)
        if entry != FileEntry(_shard_name(index, len(shards)), sink.hexdigest(), sink.bytes):
            return False
    return True


# --- reading (generators and the trainer alike) ------------------------------------------------------------


def read_manifest(uri: str, expected_sha256: str) -> tuple[Manifest, Location]:
    """Load a manifest and check it against the digest announced with it; the location of its files
    is read with the same client, whose requests fail fast (`storage.READS`): a generator retries a
    version on its own schedule."""
    try:
        target = storage.location(uri, limits=storage.READS)
    except (ValueError, ImportError) as exc:  # an announced URL this process cannot open: its problem
        raise CheckpointError("unsupported", f"cannot open {uri}: {exc}") from None
    data = storage.read_bytes(target)
    got = sha256_hex(data)
    if got != expected_sha256:
        raise CheckpointError(
            "digest_mismatch",
            f"manifest digest mismatch for {uri}: sha256 {got}, announced {expected_sha256}",
        )
    directory = Location(target.fs, target.path.rsplit("/", 1)[0])
    return Manifest.from_json(data), directory


def load_weights(manifest: Manifest, directory: Location, *, tied: bool = True) -> dict[str, torch.Tensor]:
    """Every weight shard, each verified while it is read; with `tied`, aliases name the same tensors
    as their targets (a strict `load_state_dict` needs them), else they are left out (a tied model
    fills them itself, and copying them again costs time)."""
    tensors: dict[str, torch.Tensor] = {}
    for entry in manifest.weights:
        buffer = storage.read_verified(directory, entry, manifest.digest, listed_in=MANIFEST)
        try:
            tensors.update(parse_tensors(buffer))
        except TensorFileError as exc:
            raise CheckpointError("malformed", f"{(directory / entry.name).uri()}: {exc}") from None
    missing = sorted(set(manifest.aliases.values()) - set(tensors))
    if missing:
        raise CheckpointError("malformed", f"aliases of tensors the checkpoint lacks: {missing[:3]}")
    return restore_ties(tensors, manifest.aliases) if tied else tensors
