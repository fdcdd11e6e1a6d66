"""Checkpoint store over a local directory and over a real S3 API (moto on loopback): atomic versions,
tied weights stored once, digests verified while reading, replays verified, states, pruning."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec.config
import pytest
import torch
from safetensors.torch import load_file, save_file

from sapo import storage
from sapo.checkpoints import (
    MANIFEST,
    STATE_RECORD,
    TRAINER_STATE,
    CheckpointError,
    CheckpointStore,
    Written,
    load_weights,
    read_manifest,
)
from sapo.digests import ALGORITHMS, Hashing
from sapo.tensorfile import TensorFileError, parse_tensors, write_tensors
from tests.s3 import slow_link

pytestmark = pytest.mark.unit


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return str(tmp_path / "store")
    url: str = request.getfixturevalue("s3_url")
    return url


def _state(seed: int) -> dict[str, torch.Tensor]:
    """A small state dict with a tied pair, as SmolLM2 has (lm_head shares embed_tokens' storage)."""
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(6, 4, generator=gen)
    return {
        "embed.weight": embed,
        "layer.bias": torch.randn(5, generator=gen).to(torch.bfloat16),
        "layer.weight": torch.randn(4, 4, generator=gen),
        "lm_head.weight": embed,
    }


def _files(written: Written) -> dict[str, bytes]:
    directory = written.directory
    names = storage.listdir(directory)
    return {name: storage.read_bytes(directory / name) for name in names}


def _bytes(data: bytes) -> Callable[[Hashing], object]:
    return lambda out: out.write(data)


def _put(written: Written, name: str, data: bytes) -> None:
    storage.write_file(written.directory, name, lambda out: out.write(data), "sha256")


def test_round_trip_stores_tied_weights_once_and_restores_the_tie(store_url: str) -> None:
    store = CheckpointStore(store_url, shard_bytes=64)
    state = _state(0)
    published = store.publish("n1", 1, state, base_model="tiny:0", meta={"batch_id": "b"})
    assert published.outcome == "written" and published.written is not None
    written = published.written
    manifest, directory = read_manifest(written.manifest_uri, written.manifest_sha256)
    assert manifest == written.manifest and manifest.digest == "xxh3-128"
    assert manifest.aliases == {"lm_head.weight": "embed.weight"}
    assert len(manifest.weights) == 3  # the 64-byte shard limit: one tensor per file, the tie not stored
    assert sum(e.bytes for e in manifest.weights) < 4 * (24 + 16) + 2 * 5 + 3 * 200

    loaded = load_weights(manifest, directory)
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in state.items())
    assert loaded["lm_head.weight"] is loaded["embed.weight"]
    assert "lm_head.weight" not in load_weights(manifest, directory, tied=False)
    assert store.versions("n1") == [1] and store.latest("n1") == written


def test_files_are_safetensors_the_library_reads_and_writes(tmp_path: Path) -> None:
    state = {k: v for k, v in _state(1).items() if k != "lm_head.weight"}
    ours = io.BytesIO()
    write_tensors(ours, state)
    (tmp_path / "ours.safetensors").write_bytes(ours.getvalue())
    theirs = load_file(str(tmp_path / "ours.safetensors"))
    save_file(state, str(tmp_path / "theirs.safetensors"))
    parsed = parse_tensors(bytearray((tmp_path / "theirs.safetensors").read_bytes()))
    for name, tensor in state.items():
        assert torch.equal(theirs[name], tensor) and torch.equal(parsed[name], tensor)
    with pytest.raises(TensorFileError):
        parse_tensors(bytearray(b"\x10" + bytes(7) + b"{not json}....."))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_digest_algorithm_round_trips_and_is_named(tmp_path: Path, algorithm: str) -> None:
    store = CheckpointStore(tmp_path, digest=algorithm)
    written = store.publish("n1", 0, _state(2), base_model="tiny:0").written
    assert written is not None and json.loads(_files(written)[MANIFEST])["digest"] == algorithm
    assert torch.equal(
        load_weights(written.manifest, written.directory)["layer.weight"], _state(2)["layer.weight"]
    )


def test_a_format_1_manifest_still_verifies(tmp_path: Path) -> None:
    """Written as the previous release did: safetensors' own file, sha256 under a `sha256` key."""
    directory = tmp_path / "n1" / "v00000001"
    directory.mkdir(parents=True)
    state = {k: v for k, v in _state(3).items() if k != "lm_head.weight"}
    save_file(state, str(directory / "model-00001-of-00001.safetensors"))
    data = (directory / "model-00001-of-00001.safetensors").read_bytes()
    entry = {"name": "model-00001-of-00001.safetensors", "sha256": hashlib.sha256(data).hexdigest()}
    body = {"node_id": "n1", "version": 1, "base_model": "tiny:0", "dtype": "float32", "created_at": 0.0}
    manifest_bytes = json.dumps(body | {"weights": [entry | {"bytes": len(data)}], "meta": {}}).encode()
    (directory / MANIFEST).write_bytes(manifest_bytes)
    manifest, location = read_manifest(
        (directory / MANIFEST).as_uri(), hashlib.sha256(manifest_bytes).hexdigest()
    )
    assert manifest.digest == "sha256"
    assert torch.equal(load_weights(manifest, location)["layer.weight"], state["layer.weight"])


def test_corruption_substitution_and_absence_are_told_apart(store_url: str) -> None:
    store = CheckpointStore(store_url)
    written = store.publish("n1", 1, _state(0), base_model="tiny:0").written
    assert written is not None
    with pytest.raises(CheckpointError, match="manifest digest mismatch") as wrong:
        read_manifest(written.manifest_uri, "0" * 64)
    assert wrong.value.reason == "digest_mismatch"
    assert f"announced {'0' * 64}" in str(wrong.value)  # which digest was expected, which was read
    shard = written.manifest.weights[0]
    original = _files(written)[shard.name]

    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0xFF
    _put(written, shard.name, bytes(flipped))
    with pytest.raises(CheckpointError, match="corrupt") as corrupt:
        load_weights(written.manifest, written.directory)
    assert corrupt.value.reason == "digest_mismatch"
    assert f"{MANIFEST} says {shard.digest}" in str(corrupt.value)

    _put(written, shard.name, original[:-10])  # not fully visible yet (or torn): transient
    with pytest.raises(CheckpointError) as short:
        load_weights(written.manifest, written.directory)
    assert short.value.reason == "missing"

    written.directory.fs.rm_file((written.directory / shard.name).path)
    with pytest.raises(CheckpointError) as absent:
        load_weights(written.manifest, written.directory)
    assert absent.value.reason == "missing"
    with pytest.raises(CheckpointError) as no_manifest:
        read_manifest(written.manifest_uri.replace("v00000001", "v00000009"), written.manifest_sha256)
    assert no_manifest.value.reason == "missing"


def test_a_version_without_its_manifest_is_invisible_and_cleaned_up(store_url: str) -> None:
    store = CheckpointStore(store_url)
    written = store.publish("n1", 1, _state(0), base_model="tiny:0").written
    assert written is not None
    half = store.version_dir("n1", 2)  # a writer killed before the manifest: shards, no manifest
    storage.write_file(half, "model-00001-of-00001.safetensors", lambda out: out.write(b"x" * 100), "sha256")
    assert store.versions("n1") == [1]
    assert store.latest("n1") == written
    store.remove_partial("n1")
    assert storage.listdir(store.node_dir("n1")) == ["v00000001"]


def test_a_replayed_version_is_verified_not_rewritten_and_a_different_one_is_reported(store_url: str) -> None:
    store = CheckpointStore(store_url)
    first = store.publish("n1", 1, _state(0), base_model="tiny:0").written
    assert first is not None
    before = _files(first)

    again = store.publish("n1", 1, _state(0), base_model="tiny:0")  # equal tensors, other memory
    assert again.outcome == "verified" and again.written == first
    diverged = store.publish("n1", 1, _state(7), base_model="tiny:0")
    assert diverged.outcome == "diverged" and diverged.written == first
    assert _files(first) == before  # nothing was rewritten

    store.publish("n1", 3, _state(3), base_model="tiny:0")
    assert store.publish("n1", 2, _state(2), base_model="tiny:0").outcome == "skipped"
    assert store.versions("n1") == [1, 3]


def test_a_full_state_is_bound_to_its_version_and_resumed_from_the_newest(store_url: str) -> None:
    store = CheckpointStore(store_url, keep_last=2)
    assert store.load_state("n1") is None
    for version in range(5):
        store.publish("n1", version, _state(version), base_model="tiny:0")
        if version in (0, 2):
            assert store.save_state("n1", version, _bytes(b"state %d" % version))
    assert not store.save_state("n1", 2, lambda out: out.write(b"other"))  # already there
    # Versions 3 and 4 are the newest two; 2 stays too: it holds the newest state.
    assert store.versions("n1") == [2, 3, 4] and store.states("n1") == [2]
    loaded = store.load_state("n1")
    assert loaded is not None
    written, data = loaded
    assert written.manifest.version == 2 and data == b"state 2"

    manifest = json.loads(_files(written)[MANIFEST])
    manifest["meta"] = {"edited": True}  # other weights' manifest under the state's version
    _put(written, MANIFEST, json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match="other weights"):
        store.load_state("n1")


def test_a_state_is_visible_only_once_its_record_exists(store_url: str) -> None:
    store = CheckpointStore(store_url)
    written = store.publish("n1", 0, _state(0), base_model="tiny:0").written
    assert written is not None
    storage.write_file(written.directory, "trainer_state.pt", lambda out: out.write(b"partial"), "sha256")
    assert store.states("n1") == [] and store.load_state("n1") is None
    store.save_state("n1", 0, lambda out: out.write(b"whole"))
    assert STATE_RECORD in _files(written)
    loaded = store.load_state("n1")
    assert loaded is not None and loaded[1] == b"whole"


def test_a_corrupt_trainer_state_names_the_state_record_as_what_lists_its_digest(store_url: str) -> None:
    """The state file's digest and size come from state.json, not from the version's manifest."""
    store = CheckpointStore(store_url)
    written = store.publish("n1", 0, _state(0), base_model="tiny:0").written
    assert written is not None
    store.save_state("n1", 0, _bytes(b"whole"))
    _put(written, TRAINER_STATE, b"WHOLE")
    with pytest.raises(CheckpointError, match=f"{STATE_RECORD} says") as corrupt:
        store.load_state("n1")
    assert corrupt.value.reason == "digest_mismatch" and "manifest" not in str(corrupt.value)
    _put(written, TRAINER_STATE, b"whole, and more")
    with pytest.raises(CheckpointError, match=f"15 bytes, {STATE_RECORD} says 5") as longer:
        store.load_state("n1")
    assert longer.value.reason == "digest_mismatch"


def test_format_1_checkpoints_are_refused_for_resume_with_what_to_do(tmp_path: Path) -> None:
    directory = tmp_path / "n1" / "v00000003"
    directory.mkdir(parents=True)
    extra = {"name": "trainer_state.pt", "sha256": "0" * 64, "bytes": 1}
    body = {"node_id": "n1", "version": 3, "base_model": "tiny:0", "dtype": "float32", "created_at": 0.0}
    (directory / MANIFEST).write_text(json.dumps(body | {"weights": [], "extras": [extra], "meta": {}}))
    with pytest.raises(CheckpointError, match="fresh location"):
        CheckpointStore(tmp_path).load_state("n1")


def test_bad_settings_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointStore(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="unknown digest"):
        CheckpointStore(tmp_path, digest="md5")


def test_a_version_with_a_torn_manifest_is_rewritten(store_url: str) -> None:
    """A host crash can leave a renamed version whose (unsynced) manifest is garbage: no reader can use
    it, so the replay writes it again instead of failing to verify it."""
    store = CheckpointStore(store_url)
    written = store.publish("n1", 1, _state(0), base_model="tiny:0").written
    assert written is not None
    _put(written, MANIFEST, b"\0" * 100)
    again = store.publish("n1", 1, _state(0), base_model="tiny:0")
    assert again.outcome == "written" and again.written is not None
    assert load_weights(again.written.manifest, again.written.directory)["layer.weight"].shape == (4, 4)


def test_a_location_that_is_no_small_regular_file_is_malformed_not_a_hang(tmp_path: Path) -> None:
    """An announcement names where its manifest is; a FIFO there would block the reader for good, a
    device or a huge file would fill its memory."""
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_bytes(b"{" * 2048)
    for target, says in (
        (fifo, "not a regular file"),
        (tmp_path, "not a regular file"),
        (big, "larger than"),
    ):
        with pytest.raises(storage.CheckpointError, match=says) as error:
            storage.read_bytes(storage.location(target), max_bytes=1024)
        assert error.value.reason == "malformed"
    assert storage.read_bytes(storage.location(big), max_bytes=2048) == b"{" * 2048
    with pytest.raises(storage.CheckpointError) as missing:
        storage.read_bytes(storage.location(tmp_path / "absent.json"))
    assert missing.value.reason == "missing"  # may appear later: retried


def test_a_deeply_nested_manifest_is_malformed(tmp_path: Path) -> None:
    """json.loads raises RecursionError on deep nesting: once reported as weights that do not fit."""
    nested = tmp_path / "manifest.json"
    nested.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(storage.CheckpointError) as error:
        read_manifest(nested.as_uri(), hashlib.sha256(nested.read_bytes()).hexdigest())
    assert error.value.reason == "malformed"


def test_an_http_store_that_does_not_answer_is_unavailable_not_missing(tmp_path: Path) -> None:
    """fsspec's HTTP filesystem raises FileNotFoundError for a refused connection too; only a 404 is
    an object that is not there (yet)."""
    (tmp_path / "present.json").write_bytes(b"{}")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def send_head(self):  # type: ignore[no-untyped-def]
            if self.path.startswith("/failing"):
                self.send_error(503)
                return None
            return super().send_head()

    handler = functools.partial(Handler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert storage.read_bytes(storage.location(f"{base}/present.json")) == b"{}"
        with pytest.raises(storage.CheckpointError) as absent:
            storage.read_bytes(storage.location(f"{base}/absent.json"))
        assert absent.value.reason == "missing"
        with pytest.raises(storage.CheckpointError, match="503") as failing:
            storage.read_bytes(storage.location(f"{base}/failing.json"))
        assert failing.value.reason == "unavailable"
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(storage.CheckpointError, match="cannot read") as refused:
        storage.read_bytes(storage.location(f"{base}/present.json"))  # nothing listens there now
    assert refused.value.reason == "unavailable"
    assert "does not exist" not in str(refused.value)


def test_a_store_that_finds_no_credentials_is_unavailable_and_says_what_to_set(
    no_s3_credentials: str,
) -> None:
    with pytest.raises(storage.CheckpointError) as error:
        read_manifest(f"{no_s3_credentials}/n1/v00000001/{MANIFEST}", "0" * 64)
    assert error.value.reason == "unavailable" and "AWS_ACCESS_KEY_ID" in str(error.value)


@pytest.mark.parametrize(
    "name", [5, None, ["x"], "", "..", "../v00000002/m.safetensors", "/etc/hostname", "m\0.safetensors"]
)
def test_a_manifest_naming_no_plain_file_is_malformed(tmp_path: Path, name: object) -> None:
    """The announced digest pins the manifest, not what it says: a name that is no text crashed the
    generator reading it (a TypeError), and a path would lead the reader out of the version."""
    entry = {"name": name, "digest": "0" * 32, "bytes": 1}
    body = {"node_id": "n1", "version": 1, "base_model": "tiny:0", "dtype": "float32", "created_at": 0.0}
    manifest = tmp_path / MANIFEST
    manifest.write_bytes(json.dumps(body | {"format": 2, "digest": "xxh3-128", "weights": [entry]}).encode())
    with pytest.raises(CheckpointError, match="plain file name") as error:
        read_manifest(manifest.as_uri(), hashlib.sha256(manifest.read_bytes()).hexdigest())
    assert error.value.reason == "malformed"


# --- an object store that does not answer, or answers slowly ----------------------------------------------


@contextlib.contextmanager
def _unreachable(kind: str) -> Iterator[str]:
    """An endpoint on loopback that refuses connections (`closed`), drops them unanswered (`blackholed`:
    a listener whose backlog is full, so a connect never completes) or accepts them and never answers
    (`silent`: the kernel completes the handshake of a listener that never accepts)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    if kind == "closed":
        listener.close()
    else:
        listener.listen(0 if kind == "blackholed" else 16)
    if kind == "blackholed":
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for sock in [listener, *fillers]:
            sock.close()


def _finishes_within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """The exception `call` raised, failing the test if it runs longer than `seconds` (a daemon thread:
    a call that hangs for minutes does not hold up the suite)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            raised.append(exc)
        else:
            raised.append(None)

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert raised, f"still running after {time.monotonic() - started:.1f}s"
    return raised[0]


@pytest.mark.parametrize(("kind", "bound_s"), [("closed", 3.0), ("blackholed", 8.0), ("silent", 4.0)])
def test_a_load_from_a_store_that_does_not_answer_fails_fast(
    s3_url: str, elsewhere: Callable[[str], None], monkeypatch: pytest.MonkeyPatch, kind: str, bound_s: float
) -> None:
    """One failed attempt must not hold a generator's loop for long: botocore's defaults and s3fs's own
    retries of a timed-out request held it 9 s (refused), ~30 s (blackholed), ~400 s (silent). The silent
    store's bound is set through fsspec's configuration (what an operator would set), so that the test
    stays short; by default the wait is `READS.read_timeout_s`."""
    if kind == "silent":
        monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"read_timeout": 1}})
    with _unreachable(kind) as endpoint:
        elsewhere(endpoint)
        manifest = f"{s3_url}/n1/v00000001/{MANIFEST}"
        error = _finishes_within(bound_s, lambda: read_manifest(manifest, "0" * 64))
    assert isinstance(error, CheckpointError) and error.reason == "unavailable", error


def test_store_limits_are_botocore_config_and_operators_override_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert storage.client_config(storage.READS)["retries"] == {"mode": "standard", "total_max_attempts": 1}
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"read_timeout": 60}})
    config = storage.client_config(storage.WRITES, {"connect_timeout": 1})
    assert config["read_timeout"] == 60 and config["connect_timeout"] == 1
    assert config["retries"]["total_max_attempts"] == storage.WRITES.attempts
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": "read_timeout=60"})
    assert "FSSPEC_S3_CONFIG_KWARGS" in str(storage.store_problem("s3://bucket/prefix"))


def test_a_shard_that_takes_longer_than_the_read_timeout_to_arrive_slowly_still_loads(
    s3_url: str, elsewhere: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read timeout bounds each wait for bytes, not a whole download: a shard trickling in for ~2 s
    loads under a 1 s read timeout."""
    tensor = torch.arange(300_000, dtype=torch.float32)  # 1.2 MB
    written = CheckpointStore(s3_url).publish("n1", 1, {"w": tensor}, base_model="tiny:0").written
    assert written is not None
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"read_timeout": 1}})
    with slow_link(os.environ["AWS_ENDPOINT_URL"], 64 * 1024, 0.1) as endpoint:
        elsewhere(endpoint)
        started = time.monotonic()
        manifest, directory = read_manifest(written.manifest_uri, written.manifest_sha256)
        assert torch.equal(load_weights(manifest, directory)["w"], tensor)
    assert time.monotonic() - started > 1.5  # it did arrive slowly


def test_a_local_version_whose_weights_a_host_crash_tore_is_rewritten_not_verified(tmp_path: Path) -> None:
    """Its manifest survived, its (unsynced) weights did not: the replay's weights match the manifest,
    the files do not, and a full state written beside them would make them what a restart loads."""
    store = CheckpointStore(tmp_path, shard_bytes=64)
    written = store.publish("n1", 1, _state(0), base_model="tiny:0").written
    assert written is not None and len(written.manifest.weights) > 1
    shard = Path((written.directory / written.manifest.weights[-1].name).path)
    shard.write_bytes(shard.read_bytes()[:-1])
    again = store.publish("n1", 1, _state(0), base_model="tiny:0")
    assert again.outcome == "written" and again.written is not None
    assert load_weights(again.written.manifest, again.written.directory)["layer.weight"].shape == (4, 4)
