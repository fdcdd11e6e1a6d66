"""Dead-letter publishing: rejected input keeps its original key and bytes, plus why and where from."""

from __future__ import annotations

import time

from sapo.kafka.metrics import TransportMetrics
from sapo.kafka.records import Publisher, Record

H_REASON = "sapo-dlq-reason"
H_DETAIL = "sapo-dlq-detail"
H_SOURCE = "sapo-dlq-source"
H_SERVICE = "sapo-dlq-service"
H_TIME = "sapo-dlq-time-ms"
MAX_DETAIL = 512


class DeadLetters:
    """Sends rejected records to the node's DLQ topic; operators replay or inspect them from there."""

    def __init__(self, publisher: Publisher, topic: str, service: str, metrics: TransportMetrics) -> None:
        self._publisher = publisher
        self._topic = topic
        self._service = service
        self._metrics = metrics

    def send(self, record: Record, reason: str, detail: str = "") -> None:
        headers = [(k, v) for k, v in record.headers.items() if not k.startswith("sapo-dlq-")]
        headers += [
            (H_REASON, reason.encode()),
            (H_DETAIL, detail[:MAX_DETAIL].encode()),
            (H_SOURCE, f"{record.topic}/{record.partition}/{record.offset}".encode()),
            (H_SERVICE, self._service.encode()),
            (H_TIME, str(int(time.time() * 1000)).encode()),
        ]
        self._publisher.send(self._topic, record.key, record.value or b"", headers)
        self._metrics.dead_lettered.labels(reason).inc()
