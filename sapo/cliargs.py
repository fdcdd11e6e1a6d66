"""argparse types shared by the `sapo` subcommands: a bad value is a usage error naming the flag."""

from __future__ import annotations

import argparse
import math
import socket

KAFKA_PORT = 9092
"""librdkafka's port for a broker address that names none."""


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def positive_seconds(value: str) -> float:
    """A finite duration above 0: a negative wait was taken as "forever" by the Kafka client."""
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {value}")
    return number


def bootstrap_servers(value: str) -> str:
    """`--bootstrap`: HOST[:PORT][,HOST[:PORT]...], every host resolvable. Checked before any Kafka
    client starts: librdkafka reports an empty list or an unknown host only as a generic transport
    failure, once the command's whole timeout has passed. Empty items (a trailing comma) are skipped, as
    librdkafka skips them."""
    servers = [server.strip() for server in value.split(",") if server.strip()]
    if not servers:
        raise argparse.ArgumentTypeError(_FORM.format(value=value))
    for server in servers:
        host, port = _host_port(server, value)
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise argparse.ArgumentTypeError(
                f"could not resolve host {host!r} of {value!r} ({exc.strerror}): check the name"
            ) from None
        except UnicodeError:  # the IDNA codec refuses the name (an empty label, one over 63 characters)
            raise argparse.ArgumentTypeError(f"{host!r} of {value!r} is not a host name") from None
    return value


_FORM = "must name the brokers as HOST:PORT[,HOST:PORT...]; {value!r} is not (e.g. localhost:9092)"


def _host_port(server: str, value: str) -> tuple[str, int]:
    """HOST and PORT of one broker address as librdkafka reads it: an optional `SCHEME://` prefix,
    `[IPv6]` in brackets, and port 9092 when none is named (a bare host name or IPv6 address)."""
    address = server.split("://", 1)[-1]
    port: str | None = None  # None: no port named
    if address.startswith("["):
        host, closed, rest = address[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise argparse.ArgumentTypeError(_FORM.format(value=value))
        port = rest[1:] if rest else None
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    else:  # a host name, or an IPv6 address without brackets
        host = address
    if port is None and host:
        return host, KAFKA_PORT
    if not (host and port and port.isdigit() and 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(_FORM.format(value=value))
    return host, int(port)
