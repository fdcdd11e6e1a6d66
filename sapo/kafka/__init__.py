"""Kafka transport: records and interfaces, producer, the consumer loop, dead letters, metrics."""

from sapo.kafka.consumer import (
    ConsumerLoop,
    Disposition,
    Handler,
    KafkaConsumerClient,
    KafkaReaderClient,
    TransportError,
)
from sapo.kafka.dlq import DeadLetters
from sapo.kafka.errors import BackpressureTimeoutError, DeliveryError, ProduceError, ServiceError
from sapo.kafka.metrics import TransportMetrics
from sapo.kafka.producer import KafkaPublisher
from sapo.kafka.records import ConsumerClient, Publisher, Record, Watermarks

__all__ = [
    "BackpressureTimeoutError",
    "ConsumerClient",
    "ConsumerLoop",
    "DeadLetters",
    "DeliveryError",
    "Disposition",
    "Handler",
    "KafkaConsumerClient",
    "KafkaPublisher",
    "KafkaReaderClient",
    "ProduceError",
    "Publisher",
    "Record",
    "ServiceError",
    "TransportError",
    "TransportMetrics",
    "Watermarks",
]
