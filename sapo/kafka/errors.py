"""Produce failures by kind: what went wrong when a message could not be sent (`sapo.kafka.producer`)."""

from __future__ import annotations

from confluent_kafka import KafkaError

PRODUCE_ERROR_KINDS = ("too_large", "queue_full", "timeout", "fatal", "retriable", "refused")
"""Every `error_kind`: metric labels are initialised from this."""
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
_TIMEOUT = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT})


def error_kind(err: KafkaError) -> str:
    """What kind of failure a librdkafka error is (`PRODUCE_ERROR_KINDS`)."""
    if err.fatal():
        return "fatal"
    code = err.code()
    if code in _TOO_LARGE:
        return "too_large"
    if code in _TIMEOUT:
        return "timeout"
    if code == KafkaError._QUEUE_FULL:
        return "queue_full"
    return "retriable" if err.retriable() else "refused"


class ServiceError(RuntimeError):
    """A failure of the service or its infrastructure, not of the message being handled: the consumer
    loop never contains it (the service stops and its restart recovers), unlike an error a message
    caused (`sapo.kafka.consumer`)."""


class ProduceError(ServiceError):
    """A message that could not be sent; `kind` is one of `PRODUCE_ERROR_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class DeliveryError(ProduceError):
    """The broker did not acknowledge a message that the caller waited for."""

    def __init__(self, message: str, kind: str = "timeout") -> None:
        super().__init__(kind, message)


class BackpressureTimeoutError(ProduceError):
    """The local queue stayed full for longer than the bound: the broker is not keeping up."""

    def __init__(self, message: str) -> None:
        super().__init__("queue_full", message)
