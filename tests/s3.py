"""A real S3 API on loopback for tests and benches: moto's server in its own process.

Clients get explicit credentials and the endpoint through the same `AWS_*` variables a deployment sets
(`S3Server.env`), so nothing ever looks for cloud credentials or a metadata service. Every test takes
a fresh bucket (`create_bucket`). `slow_link` puts a slow network between a client and the server.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import s3fs

_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this server (also what the chart's Secret would carry)."""
        return {
            "AWS_ACCESS_KEY_ID": "sapo-test",
            "AWS_SECRET_ACCESS_KEY": "sapo-test-secret",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self) -> s3fs.S3FileSystem:
        """A client of its own (no fsspec instance cache), for a test's direct look at objects."""
        env = self.env
        return s3fs.S3FileSystem(
            key=env["AWS_ACCESS_KEY_ID"],
            secret=env["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=self.endpoint,
            client_kwargs={"region_name": env["AWS_DEFAULT_REGION"]},
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    def create_bucket(self, prefix: str = "sapo") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)
        return name


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


@contextlib.contextmanager
def moto_server() -> Iterator[S3Server]:
    """Start `moto.server` on a free 127.0.0.1 port; stop it on exit."""
    port = _free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _answers(endpoint):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start on {endpoint} (exit {process.poll()})")
            time.sleep(0.1)
        yield S3Server(endpoint)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def slow_link(endpoint: str, piece: int, pause_s: float) -> Iterator[str]:
    """A TCP proxy to `endpoint` that passes the answers on `piece` bytes every `pause_s`."""
    upstream = urlparse(endpoint)
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(source: socket.socket, sink: socket.socket, slow: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(piece if slow else 1 << 20):
                sink.sendall(data)
                if slow:
                    time.sleep(pause_s)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                server = socket.create_connection((upstream.hostname, upstream.port))
                threading.Thread(target=pump, args=(client, server, False), daemon=True).start()
                threading.Thread(target=pump, args=(server, client, True), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
