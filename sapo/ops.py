"""One small HTTP server per service: /metrics, /healthz, /readyz; plus structured logging.

/healthz answers 200 while the service's main loop keeps beating (a wedged loop turns it 503 so the
kubelet restarts the pod). /readyz answers 200 only when every named condition holds (model loaded,
partitions assigned, broker reachable, ...) and lists the failing ones otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sapo.settings import LogFormat


class Health:
    """Liveness from a heartbeat, readiness from named conditions; both thread-safe."""

    def __init__(self, max_silence_s: float = 60.0) -> None:
        self._max_silence_s = max_silence_s
        self._beat = time.monotonic()
        self._conditions: dict[str, bool] = {}
        self._deadlines: dict[str, float] = {}
        self._lock = threading.Lock()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def set_max_silence(self, seconds: float) -> None:
        """Loops that block on long work (a training step) widen the liveness window before it."""
        self._max_silence_s = seconds

    def alive(self) -> bool:
        now = time.monotonic()
        with self._lock:
            overdue = any(now > deadline for deadline in self._deadlines.values())
        return not overdue and now - self._beat <= self._max_silence_s

    def fail_after(self, name: str, seconds: float | None) -> None:
        """Liveness fails once `seconds` pass before this is called again with None: for a loop that
        beats but makes no progress (a generator that cannot load the version it waits for)."""
        with self._lock:
            if seconds is None:
                self._deadlines.pop(name, None)
            else:
                self._deadlines[name] = time.monotonic() + seconds

    def require(self, *names: str) -> None:
        """Declare conditions that start false; readiness waits for all of them."""
        with self._lock:
            for name in names:
                self._conditions.setdefault(name, False)

    def set(self, name: str, ok: bool) -> None:
        with self._lock:
            self._conditions[name] = ok

    def failing(self) -> list[str]:
        with self._lock:
            return sorted(name for name, ok in self._conditions.items() if not ok)


class OpsServer:
    """Serves the three endpoints from a daemon thread; `port` is the bound port (0 picks one).

    The thread sleeps until a connection or `stop` arrives. `serve_forever` would wake it twice a
    second to look for a shutdown request, in every process of a node, whether anyone scrapes or not.
    """

    def __init__(
        self, registry: CollectorRegistry, health: Health, host: str = "0.0.0.0", port: int = 8080
    ) -> None:
        handler = _make_handler(registry, health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._wake_read, self._wake_write = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="ops-http", daemon=True)

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._wake_write.fileno() < 0:  # stopped before
            return
        self._wake_write.send(b"\0")
        if self._thread.is_alive():
            self._thread.join()
        self._server.server_close()
        self._wake_read.close()
        self._wake_write.close()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_read in ready:
                    return
                self._server.handle_request()  # the listening socket is readable: accepts at once


def _make_handler(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                # `name[]` selects series by sample name, as prometheus_client's own handler does: a
                # poller that wants a few numbers then costs the service a few series, not all of them.
                names = parse_qs(query).get("name[]")
                source = registry.restricted_registry(names) if names else registry
                self._reply(200, generate_latest(source), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = health.alive()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"main loop stalled\n")
            elif path == "/readyz":
                failing = health.failing()
                body = ("ready\n" if not failing else "not ready: " + ", ".join(failing) + "\n").encode()
                self._reply(503 if failing else 200, body)
            else:
                self._reply(404, b"not found\n")

        def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # A client that hung up (a scraper's timeout) needs no answer and no traceback in the log.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            # Probes every few seconds would drown the service's own log.
            return

    return Handler


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the service and node attached, for log pipelines."""

    def __init__(self, service: str, node_id: str) -> None:
        super().__init__()
        self._static = {"service": service, "node": node_id}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self._static,
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, fmt: LogFormat, service: str, node_id: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt is LogFormat.JSON:
        handler.setFormatter(JsonFormatter(service, node_id))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service}[{node_id}] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
