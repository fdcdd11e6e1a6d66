"""Where checkpoints live: a local directory or any fsspec URL, and the byte-level operations on it.

A store is named by a path or URL: `/data/ckpt` or `file:///data/ckpt` (one machine or a shared
volume), `s3://bucket/prefix` (s3fs), or anything else fsspec speaks (`gs://`, `az://`, ... with their
packages installed). Nothing here talks to S3 itself.

Credentials come from the environment, as s3fs / botocore read them: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN` for temporary ones), `AWS_DEFAULT_REGION` (or
`AWS_REGION`), `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) for an S3-compatible store such as MinIO
or Ceph, `AWS_PROFILE` / `AWS_SHARED_CREDENTIALS_FILE` for a mounted credentials file; an IAM role
(IRSA, instance profile) needs none of them. fsspec's own `FSSPEC_S3_<KEY>` variables (for example
`FSSPEC_S3_ENDPOINT_URL`) also apply.

Every request to an `s3://` store is bounded (`Limits`): s3fs's defaults (15 s per read, botocore's
five attempts, and five retries of its own of a timed-out request on top of them) held one failed read
of a store that accepted connections and never answered for ~400 s, and of a blackholed endpoint ~30 s.
Writes (the trainer) get `WRITES`: retries absorb a throttled or reset request, and a read timeout
long enough for an upload's last bytes still in the socket buffers of a slow link. Generators read with
`READS`: one attempt, short timeouts, because a failed load is retried on the generator's own schedule
(`sapo.generator.reload`) and the attempt holds up its loop. The read timeout bounds each wait for
bytes (aiohttp's `sock_read`, armed once the request is sent and re-armed by every chunk received), not
a whole transfer: a large shard from a slow but working store is not cut short. To change them, set
`FSSPEC_S3_CONFIG_KWARGS` to the JSON of botocore `Config` arguments, for example
`{"read_timeout": 60, "retries": {"mode": "standard", "total_max_attempts": 5}}`; what it names wins.

Reads and writes hash the bytes that pass (see `sapo.digests`): a file is written once and read once.
A local file is read through a private memory map, so the tensors parsed from it view the very pages
that were hashed; a remote object is fetched with one request into one buffer, which is hashed and
then parsed in place.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final
from urllib.parse import unquote, urlparse

import fsspec
import fsspec.config
from fsspec.implementations.local import LocalFileSystem

from sapo.digests import Hashing, new_hasher

CHUNK = 16 * 1024 * 1024
MAX_SMALL_FILE_BYTES = 16 * 1024 * 1024
"""Largest file `read_bytes` takes whole: a manifest lists a few dozen files in a few kilobytes; a
location an announcement names is not trusted to be one."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, unreadable or does not match its recorded digests.

    `reason` is a bounded label for metrics: missing and unavailable are transient (an object not
    visible yet, a store that did not answer); digest_mismatch, malformed, unsupported, exists,
    base_model_mismatch are not.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


TRANSIENT = frozenset({"missing", "unavailable"})
CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or give the process an IAM role) "
    "for s3://, or the credentials of the store's fsspec filesystem"
)
_NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError"})
"""botocore's errors for credentials not found (s3fs passes them on as they are; by name: botocore is
s3fs's dependency, not this package's)."""


def refused_access(target: Location, exc: BaseException) -> bool:
    """Whether a remote store found no credentials for this process or refused the ones it has (s3fs
    turns a 403 such as InvalidAccessKeyId or AccessDenied into a PermissionError caused by botocore's
    `ClientError`). A PermissionError of this machine's own files (a cache directory) is not one."""
    if target.local:
        return False
    if type(exc).__name__ in _NO_CREDENTIALS:
        return True
    answered = type(exc.__cause__).__mro__ if exc.__cause__ is not None else ()
    return isinstance(exc, PermissionError) and any(cls.__name__ == "ClientError" for cls in answered)


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint, as its manifest (or a state record) records it."""

    name: str
    digest: str
    bytes: int


@dataclass(frozen=True)
class Location:
    """A directory of some filesystem; `path` is what `fs` takes (no protocol)."""

    fs: Any  # fsspec.AbstractFileSystem (fsspec ships no type information)
    path: str

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def __truediv__(self, name: str) -> Location:
        return Location(self.fs, str(PurePosixPath(self.path) / name))

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    def uri(self) -> str:
        """What another process passes to `location()` to reach the same place."""
        if self.local:
            return Path(self.path).as_uri()
        return str(self.fs.unstrip_protocol(self.path))

    def forget_listings(self) -> None:
        """Drop cached listings, so that a new object (or a deleted one) is seen now."""
        if not self.local:
            self.fs.invalidate_cache(self.path)


@dataclass(frozen=True)
class Limits:
    """How long one request to an object store may take: seconds to connect, seconds to wait for each
    read of its answer, and attempts (botocore's standard retry mode: exponential backoff with jitter)."""

    connect_timeout_s: float
    read_timeout_s: float
    attempts: int

    def config_kwargs(self) -> dict[str, Any]:
        """The botocore `Config` arguments s3fs takes as `config_kwargs`."""
        return {
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.read_timeout_s,
            "retries": {"mode": "standard", "total_max_attempts": self.attempts},
        }


WRITES: Final = Limits(connect_timeout_s=5.0, read_timeout_s=30.0, attempts=3)
READS: Final = Limits(connect_timeout_s=3.0, read_timeout_s=10.0, attempts=1)
_S3_PROTOCOLS: Final = frozenset({"s3", "s3a"})


def location(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None, *, limits: Limits = WRITES
) -> Location:
    """The store or file at a path or URL (`file://` URIs may be percent-encoded, as `Path.as_uri` does);
    an `s3://` store's requests are bounded by `limits` (see the module docstring)."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "file" or (not parsed.scheme or len(parsed.scheme) == 1):  # c:\ style too
        path = unquote(parsed.path) if parsed.scheme == "file" else text
        return Location(LocalFileSystem(), str(Path(path).absolute()))
    options = dict(storage_options or {})
    s3 = parsed.scheme in _S3_PROTOCOLS
    if s3:
        options["config_kwargs"] = client_config(limits, options.get("config_kwargs"))
    fs, path = fsspec.core.url_to_fs(text, **options)
    if s3:
        # s3fs retries a timed-out request five more times on top of botocore's attempts, and takes
        # that count only as an attribute: botocore's attempts are the only retries.
        fs.retries = 1
    return Location(fs, str(path))


def client_config(limits: Limits, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """botocore `Config` arguments: `limits`, under what fsspec's configuration says for s3
    (`FSSPEC_S3_CONFIG_KWARGS`, `FSSPEC_S3`), under what the caller gives."""
    configured = fsspec.config.conf.get("s3", {}).get("config_kwargs") or {}
    if not isinstance(configured, dict):
        raise ValueError(
            f"FSSPEC_S3_CONFIG_KWARGS must be a JSON object of botocore Config arguments, got {configured!r}"
        )
    return limits.config_kwargs() | configured | (given or {})


def store_problem(url: str) -> str | None:
    """Why the checkpoint store at `url` cannot be used, found without a request, or None: a protocol
    fsspec does not know or whose package is not installed, a local directory that cannot be created
    (it is made now, as the first write would) or written. Credentials and reachability of a remote
    store show only on its first request (`refused_access` tells credentials apart)."""
    try:
        where = location(url)
    except (ValueError, ImportError) as exc:  # 'Protocol not known: foo', 'Please install gcsfs ...'
        return str(exc)
    if not where.local:
        return None
    try:
        os.makedirs(where.path, exist_ok=True)
    except OSError as exc:
        return f"cannot create the directory {where.path} ({exc.strerror or exc})"
    if not os.access(where.path, os.W_OK | os.X_OK):
        return f"cannot write the directory {where.path}"
    return None


def write_file(
    directory: Location,
    name: str,
    produce: Callable[[Hashing], object],
    algorithm: str,
    *,
    durable: bool = True,
) -> FileEntry:
    """Create `directory/name` with what `produce` writes, hashing on the way; a local file is fsynced
    when `durable` (an object store's PUT is durable when it returns)."""
    target = (directory / name).path
    if directory.local:
        os.makedirs(directory.path, exist_ok=True)
        with open(target, "wb") as raw:
            sink = Hashing(raw, algorithm)
            produce(sink)
            if durable:
                raw.flush()
                os.fsync(raw.fileno())
    else:
        with directory.fs.open(target, "wb") as raw:
            sink = Hashing(raw, algorithm)
            produce(sink)
    return FileEntry(name, sink.hexdigest(), sink.bytes)


def read_bytes(target: Location, max_bytes: int = MAX_SMALL_FILE_BYTES) -> bytes:
    """A small file whole (a manifest); CheckpointError missing / unavailable when it cannot be read
    (yet), malformed when it is no regular file (a directory, a FIFO that would block the reader for
    good, a device) or larger than `max_bytes`."""
    target.forget_listings()
    try:
        if target.local:
            require_regular(target.path)
        with target.fs.open(target.path, "rb") as fh:
            data: bytes = fh.read(max_bytes + 1)
    except CheckpointError:
        raise
    except Exception as exc:  # any failure of a remote store is a store being unavailable
        raise read_error(target, exc) from None
    if len(data) > max_bytes:
        raise CheckpointError("malformed", f"{target.uri()} is larger than the {max_bytes} bytes it may have")
    return data


def read_error(target: Location, exc: Exception) -> CheckpointError:
    """`missing` when the store said the object is not there, `unavailable` when it did not answer.
    fsspec's HTTP filesystem reports every failure as FileNotFoundError, a refused connection or a
    server error too, with the real error as its cause."""
    if isinstance(exc, FileNotFoundError):
        if not _no_answer(exc.__cause__):
            return CheckpointError("missing", f"{target.uri()} does not exist (yet)")
        exc = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
    hint = f"; {CREDENTIALS_HINT}" if refused_access(target, exc) else ""
    return CheckpointError("unavailable", f"cannot read {target.uri()}: {exc!r}{hint}")


def _no_answer(cause: BaseException | None) -> bool:
    """A failure to get an answer (no connection, a timeout, an HTTP status other than 404), as opposed to
    a store's "no such object" (s3fs gives its botocore error as the cause: that one has no status)."""
    if isinstance(cause, FileNotFoundError):
        return False
    if isinstance(cause, OSError | TimeoutError):
        return True
    status = getattr(cause, "status", None)
    return isinstance(status, int) and status != 404


def require_regular(path: str) -> None:
    """Raise CheckpointError(malformed) unless `path` is a regular file (stat, which never blocks:
    opening a FIFO for reading would wait for a writer)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise CheckpointError("malformed", f"{Path(path).as_uri()} is not a regular file")


def read_verified(
    directory: Location, entry: FileEntry, algorithm: str, *, listed_in: str
) -> bytearray | mmap.mmap:
    """The file's bytes in a writable buffer, hashed as they are read and checked against `entry`, which
    the file `listed_in` (of the same directory) records: a mismatch names it."""
    target = directory / entry.name
    try:
        if target.local:
            buffer, got = _read_local(target.path, entry, algorithm, listed_in)
        else:
            buffer, got = _read_remote(target, entry, algorithm, listed_in)
    except CheckpointError:
        raise
    except Exception as exc:  # a remote store failing in its own way, a local I/O error
        raise read_error(target, exc) from None
    if got != entry.digest:
        raise CheckpointError(
            "digest_mismatch",
            f"checkpoint file corrupt: {target.uri()} has {algorithm} {got}, {listed_in} says {entry.digest}",
        )
    return buffer


def _check_size(uri: str, size: int, entry: FileEntry, listed_in: str) -> None:
    if size < entry.bytes:  # an object or NFS file not (fully) visible yet
        raise CheckpointError("missing", f"{uri} has {size} of its {entry.bytes} bytes so far")
    if size > entry.bytes:
        raise CheckpointError("digest_mismatch", f"{uri} has {size} bytes, {listed_in} says {entry.bytes}")


def _read_local(
    path: str, entry: FileEntry, algorithm: str, listed_in: str
) -> tuple[bytearray | mmap.mmap, str]:
    hasher = new_hasher(algorithm)
    require_regular(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        _check_size(path, size, entry, listed_in)
        if size == 0:
            return bytearray(), hasher.hexdigest()
        # Copy-on-write: writable for torch.frombuffer, and nothing we do reaches the file.
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    for start in range(0, size, CHUNK):
        hasher.update(view[start : start + CHUNK])
    view.release()
    return mapped, hasher.hexdigest()


def _read_remote(target: Location, entry: FileEntry, algorithm: str, listed_in: str) -> tuple[bytearray, str]:
    # One request for the whole object: ranged reads cost a round trip each (and S3 emulators such as
    # moto re-read the whole object for every range).
    target.forget_listings()
    with target.fs.open(target.path, "rb") as fh:  # (s3fs: one GET; measured 2x faster than cat_file)
        _check_size(target.uri(), int(fh.size), entry, listed_in)
        data = fh.read()
    _check_size(target.uri(), len(data), entry, listed_in)
    buffer = bytearray(data)  # writable, for torch.frombuffer
    del data
    hasher = new_hasher(algorithm)
    view = memoryview(buffer)
    for start in range(0, len(buffer), CHUNK):
        hasher.update(view[start : start + CHUNK])
    return buffer, hasher.hexdigest()


def glob(pattern: Location) -> list[str]:
    """Paths matching `pattern.path` (fresh listings)."""
    pattern.forget_listings()
    return [str(p) for p in pattern.fs.glob(pattern.path)]


def listdir(directory: Location) -> list[str]:
    """Names directly inside `directory` (none when it does not exist)."""
    directory.forget_listings()
    try:
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in directory.fs.ls(directory.path, detail=False)]
    except FileNotFoundError:
        return []


def exists(target: Location) -> bool:
    target.forget_listings()
    return bool(target.fs.exists(target.path))


def remove_tree(directory: Location, first: tuple[str, ...] = ()) -> None:
    """Delete a directory; the files named in `first` go before the rest (what makes a version visible)."""
    for name in first:
        if exists(directory / name):
            directory.fs.rm_file((directory / name).path)
    if exists(directory):
        directory.fs.rm(directory.path, recursive=True)


def make_durable(directory: Location) -> None:
    """fsync every file in a local directory, then the directory itself (object stores: nothing to do)."""
    if not directory.local:
        return
    for name in os.listdir(directory.path):
        fd = os.open(os.path.join(directory.path, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(directory.path)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
