"""Dead-letter publishing: rejected input keeps its key, bytes and headers (in a form that fits one
message), plus why and where from.

A dead letter must never be what stops a service: whatever a hostile or broken producer sent (a
payload of any size, a megabyte of headers, a huge key), its dead letter fits one message of the
node's own limit. The original value is kept whole when it fits `max_value_bytes` and cut to it
otherwise (`sapo-dlq-original-bytes` and `-sha256` then describe the whole, so an operator can still
match it against the source offset); header values and keys are cut to bounded sizes and headers
beyond a total budget are dropped (`sapo-dlq-headers-dropped` says how many). A dead letter the
producer refuses anyway is counted in `sapo_<service>_dead_letters_failed_total{kind}` and logged;
one the broker later fails to acknowledge is counted by the producer (`produce_errors_total`).
Either way the caller goes on: the record is finished as it would have been.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from typing import Final

from sapo.kafka.errors import ProduceError
from sapo.kafka.metrics import TransportMetrics
from sapo.kafka.records import Header, Publisher, Record

log = logging.getLogger(__name__)

H_REASON = "sapo-dlq-reason"
H_DETAIL = "sapo-dlq-detail"
H_SOURCE = "sapo-dlq-source"
H_SERVICE = "sapo-dlq-service"
H_TIME = "sapo-dlq-time-ms"
H_ORIGINAL_BYTES = "sapo-dlq-original-bytes"
H_ORIGINAL_SHA = "sapo-dlq-original-sha256"
H_HEADERS_DROPPED = "sapo-dlq-headers-dropped"
MAX_DETAIL = 512
MAX_KEY_BYTES: Final = 1024
MAX_HEADER_NAME: Final = 128
MAX_HEADER_VALUE: Final = 1024
MAX_HEADERS_BYTES: Final = 16 * 1024
"""Total of the original headers kept; with the dead-letter headers it stays well inside the 64 KiB
every message keeps free for headers (`sapo.kafka.chunks.HEADROOM_BYTES`)."""
DEFAULT_MAX_VALUE_BYTES: Final = 512 * 1024


def kept_headers(headers: Iterable[tuple[str, bytes]]) -> tuple[list[Header], int]:
    """The original headers as a dead letter keeps them (cut, within the budget), and how many were
    dropped. Earlier dead-letter headers are replaced, never stacked."""
    kept: list[Header] = []
    used = dropped = 0
    for raw_name, raw_value in headers:
        if raw_name.startswith("sapo-dlq-"):
            continue
        name, value = raw_name[:MAX_HEADER_NAME], raw_value[:MAX_HEADER_VALUE]
        if used + len(name) + len(value) > MAX_HEADERS_BYTES:
            dropped += 1
            continue
        used += len(name) + len(value)
        kept.append((name, value))
    return kept, dropped


def dead_letter(
    record: Record, reason: str, detail: str, service: str, max_value_bytes: int
) -> tuple[bytes | None, bytes, list[Header]]:
    """(key, value, headers) of the dead letter of `record`: see the module docstring."""
    value = record.value or b""
    headers, dropped = kept_headers(record.headers.items())
    headers += [
        (H_REASON, reason.encode()[:128]),
        (H_DETAIL, detail.encode("utf-8", "replace")[:MAX_DETAIL]),
        (H_SOURCE, f"{record.topic}/{record.partition}/{record.offset}".encode()),
        (H_SERVICE, service.encode()),
        (H_TIME, str(int(time.time() * 1000)).encode()),
    ]
    if dropped:
        headers.append((H_HEADERS_DROPPED, str(dropped).encode()))
    if len(value) > max_value_bytes:
        headers.append((H_ORIGINAL_BYTES, str(len(value)).encode()))
        headers.append((H_ORIGINAL_SHA, hashlib.sha256(value).hexdigest().encode()))
        value = value[:max_value_bytes]
    key = record.key[:MAX_KEY_BYTES] if record.key is not None else None
    return key, value, headers


class DeadLetters:
    """Sends rejected records to the node's DLQ topic; operators replay or inspect them from there."""

    def __init__(
        self,
        publisher: Publisher,
        topic: str,
        service: str,
        metrics: TransportMetrics,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self._publisher = publisher
        self._topic = topic
        self._service = service
        self._metrics = metrics
        self._max_value_bytes = max_value_bytes

    def send(self, record: Record, reason: str, detail: str = "") -> None:
        """Dead-letter `record` (counted); a dead letter that cannot be sent is counted and logged,
        never raised."""
        key, value, headers = dead_letter(record, reason, detail, self._service, self._max_value_bytes)
        try:
            self._publisher.send(self._topic, key, value, headers, best_effort=True)
        except ProduceError as exc:
            self._metrics.dead_letters_failed.labels(exc.kind).inc()
            source = f"{record.topic}/{record.partition}/{record.offset}"
            log.error("dead letter of %s (%s) not sent: %s", source, reason, exc)
            return
        self._metrics.dead_lettered.labels(reason).inc()
