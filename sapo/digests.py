"""Content digests of checkpoint files, by the algorithm a manifest names.

Threat model. A `PolicyUpdate` pins the manifest with its sha256 (small: cheap to hash with the strongest
function), so whoever can write Kafka's policy topic decides which manifest a generator reads. The
manifest pins every file with the algorithm it names:

- `xxh3-128` (the default, `xxhash`): about 17 GB/s here, 10x sha256, so verifying a 135M policy costs
  ~25 ms instead of ~250 ms. It detects what actually happens to checkpoints: torn or partial writes,
  bit rot, a half-visible object on NFS or S3, a file of another version. It is not collision
  resistant: someone who can write the checkpoint store (but not the policy topic) could craft a shard
  that matches. Use it when the store is as trusted as the node's Kafka (the usual case: the same
  Secret grants both).
- `blake3` (`blake3`): cryptographic, ~4-5 GB/s here (~2x sha256). Choose it when the store is
  shared with writers the node does not trust; the chain Kafka -> sha256(manifest) -> blake3(files)
  is then cryptographic end to end.
- `sha256`: what manifests without an algorithm field (format 1) used; still read.

Digests are computed over the bytes as they are written and as they are read (`Hashing`), never by a
second pass over a file.
"""

from __future__ import annotations

import hashlib
from typing import IO, Final, Protocol

import blake3
import xxhash

XXH3_128: Final = "xxh3-128"
BLAKE3: Final = "blake3"
SHA256: Final = "sha256"
ALGORITHMS: Final = (XXH3_128, BLAKE3, SHA256)
DEFAULT: Final = XXH3_128


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new_hasher(algorithm: str) -> Hasher:
    """A fresh incremental hasher; `ValueError` for an algorithm this build does not know."""
    if algorithm == XXH3_128:
        return xxhash.xxh3_128()
    if algorithm == BLAKE3:
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    if algorithm == SHA256:
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def digest(algorithm: str, data: bytes | bytearray | memoryview) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def sha256_hex(data: bytes) -> str:
    """The digest a PolicyUpdate carries for its manifest."""
    return hashlib.sha256(data).hexdigest()


class Sink(Protocol):
    """Where serialized bytes go."""

    def write(self, data: bytes | bytearray | memoryview, /) -> object: ...


class Hashing:
    """A binary writer that hashes and counts every byte on its way to `sink` (None: hash only)."""

    def __init__(self, sink: IO[bytes] | None, algorithm: str) -> None:
        self._sink = sink
        self.hasher = new_hasher(algorithm)
        self.bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hasher.update(data)
        if self._sink is not None:
            self._sink.write(data)
        size = memoryview(data).nbytes
        self.bytes += size
        return size

    def flush(self) -> None:  # torch.save flushes the stream it writes to
        if self._sink is not None:
            self._sink.flush()

    def hexdigest(self) -> str:
        return self.hasher.hexdigest()
