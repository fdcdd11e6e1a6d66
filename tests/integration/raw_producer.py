"""A producer that writes what confluent-kafka's Python API cannot: header names of any bytes.

Another client (Java, Go, a hand-written one) may put a header name that is not UTF-8 on a topic a
service reads; the Python API encodes every name from a `str`, so this calls librdkafka, the library
confluent-kafka ships, through ctypes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import confluent_kafka

_VTYPE_END, _VTYPE_TOPIC, _VTYPE_VALUE, _VTYPE_KEY, _VTYPE_HEADERS = 0, 1, 4, 5, 10


def _librdkafka() -> ctypes.CDLL:
    libs = Path(confluent_kafka.__file__).resolve().parents[1] / "confluent_kafka.libs"
    lib = ctypes.CDLL(str(next(libs.glob("librdkafka*"))))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.rd_kafka_conf_set.argtypes += [ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_header_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t]
    lib.rd_kafka_header_add.argtypes += [ctypes.c_char_p, ctypes.c_ssize_t]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    return lib


def produce_raw(
    bootstrap: str, topic: str, key: bytes, value: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """Write one message with `headers` exactly as given and wait for the broker's acknowledgement."""
    lib = _librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"bootstrap.servers", bootstrap.encode(), error, len(error))
    producer = lib.rd_kafka_new(0, conf, error, len(error))  # 0: RD_KAFKA_PRODUCER
    assert producer, error.value
    try:
        raw_headers = lib.rd_kafka_headers_new(len(headers))
        for name, header_value in headers:
            lib.rd_kafka_header_add(raw_headers, name, len(name), header_value, len(header_value))
        code = lib.rd_kafka_producev(
            ctypes.c_void_p(producer),
            ctypes.c_int(_VTYPE_TOPIC),
            ctypes.c_char_p(topic.encode()),
            ctypes.c_int(_VTYPE_KEY),
            ctypes.c_char_p(key),
            ctypes.c_size_t(len(key)),
            ctypes.c_int(_VTYPE_VALUE),
            ctypes.c_char_p(value),
            ctypes.c_size_t(len(value)),
            ctypes.c_int(_VTYPE_HEADERS),
            ctypes.c_void_p(raw_headers),
            ctypes.c_int(_VTYPE_END),
        )
        assert code == 0, lib.rd_kafka_err2str(code)
        assert lib.rd_kafka_flush(producer, 30_000) == 0, "not acknowledged within 30 s"
    finally:
        lib.rd_kafka_destroy(producer)
