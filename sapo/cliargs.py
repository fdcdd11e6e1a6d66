"""argparse types shared by the `sapo` subcommands: a bad value is a usage error naming the flag. The
rule of a broker list (`broker_addresses`) is declared here once: the `--bootstrap` flags, the settings'
`KafkaConnection.bootstrap_servers` and a manifest's `bootstrap` all check with it."""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import socket
from dataclasses import dataclass
from typing import Final

from sapo.topics import MAX_MESSAGE_BYTES, MIN_MESSAGE_BYTES, PREFIX_RE

KAFKA_PORT: Final = 9092
"""librdkafka's port for a broker address that names none."""
BROKER_SCHEMES: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""The `SCHEME://` a broker address may start with (either case): librdkafka's security protocols. It
drops a broker of any other scheme, or of one that is not its `security.protocol` (`KafkaConnection`
checks that), and with none left it only ever reports a generic transport failure."""
_LABEL: Final = re.compile(r"[A-Za-z0-9_-]{1,63}")
"""One label of a host name or an IPv4 address: ASCII, as librdkafka hands the name to the resolver
(Python's resolver would encode an international name first, so it would pass here and fail there)."""
_PORT: Final = re.compile(r"[0-9]+")


MAX_INT = 2**31 - 1
"""The largest count a flag takes: Kafka's partition counts are int32, and larger numbers overflowed
the C integers they reach (an OverflowError traceback) rather than being refused."""


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    if number > MAX_INT:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_INT}, got {number}")
    return number


MAX_SECONDS = (2**31 - 1) // 1000
"""The longest wait a flag takes (~24.8 days): the Kafka client counts timeouts in int32 milliseconds,
and a longer one failed at once, reported as the cluster not answering within it."""


def message_bytes(value: str) -> int:
    """`--max-message-bytes`: within the bounds the services' MAX_MESSAGE_BYTES takes, so that they can
    be given the value the topics were created with."""
    number = int(value)
    if not MIN_MESSAGE_BYTES <= number <= MAX_MESSAGE_BYTES:
        bounds = f"{MIN_MESSAGE_BYTES}..{MAX_MESSAGE_BYTES}"
        raise argparse.ArgumentTypeError(f"must be {bounds} (the services' MAX_MESSAGE_BYTES), got {number}")
    return number


def wall_seconds(value: str) -> float:
    """A finite duration above 0 that the clock measures (`inspect --duration`): no Kafka client waits
    for it, so it is not bounded by their int32 milliseconds."""
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {value}")
    return number


def positive_seconds(value: str) -> float:
    """A finite duration above 0 that a Kafka client waits: a negative wait was taken as "forever" by
    the client, and one beyond its int32 milliseconds failed at once."""
    number = wall_seconds(value)
    if number > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS} seconds (~24 days), got {value}")
    return number


def topic_prefix(value: str) -> str:
    """`--prefix`: what every topic name starts with, checked as the flag is read."""
    if not PREFIX_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"invalid topic prefix {value!r}: use 1-64 ASCII letters, digits, '.', '_' or '-'"
        )
    return value


@dataclass(frozen=True)
class BrokerAddress:
    """One broker of a `bootstrap.servers` list as librdkafka reads it."""

    scheme: str | None
    """The `SCHEME://` it names, upper case; None when it names none."""
    host: str
    """A host name, an IPv4 address, or an IPv6 address (without brackets)."""
    port: int


def broker_addresses(value: str) -> tuple[BrokerAddress, ...]:
    """The brokers of a `bootstrap.servers` list, HOST[:PORT][,HOST[:PORT]...], or ValueError saying what
    is wrong. Each address as librdkafka reads it: an optional `SCHEME://` (`BROKER_SCHEMES`), `[IPv6]`
    in brackets, a bare IPv6 address, port 9092 when none is named. Empty items (a trailing comma) are
    skipped, as librdkafka skips them. The form only: no name is looked up (`check_brokers` does), so a
    service may name a broker whose name resolves later."""
    servers = [server.strip() for server in value.split(",") if server.strip()]
    if not servers:
        raise ValueError(_form(value, "it names no broker"))
    return tuple(
        _address(server, value, of=f" of {server!r}" if len(servers) > 1 else "") for server in servers
    )


def check_brokers(value: str) -> str:
    """`value` if it is a broker list (`broker_addresses`) every host of which resolves now, else
    ValueError saying what is wrong. For commands, which use the brokers at once: librdkafka reports an
    empty list or an unknown host only as a generic transport failure, once the command's whole timeout
    has passed."""
    for address in broker_addresses(value):
        try:
            socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ValueError(
                f"could not resolve host {address.host!r} of {value!r} ({exc.strerror}): check the name"
            ) from None
        except UnicodeError:  # the IDNA codec refuses the name (the form above should have)
            raise ValueError(f"{address.host!r} of {value!r} is not a host name") from None
    return value


def bootstrap_servers(value: str) -> str:
    """`--bootstrap`: a broker list every host of which resolves (`check_brokers`), checked before any
    Kafka client starts."""
    try:
        return check_brokers(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _form(value: str, reason: str) -> str:
    form = "must name the brokers as HOST:PORT[,HOST:PORT...] (e.g. localhost:9092)"
    return f"{form}; {value!r} is not: {reason}"


def _address(server: str, value: str, of: str) -> BrokerAddress:
    """One item of the list `value`; `of` names the item in a message (" of 'b:1'") when the list has
    more than one."""
    scheme: str | None = None
    address = server
    if "://" in server:
        named, _, address = server.partition("://")
        scheme = named.upper()
        if scheme not in BROKER_SCHEMES:
            raise ValueError(
                _form(value, f"the scheme {named}://{of} is none of {', '.join(BROKER_SCHEMES)}")
            )
    port: str | None = None  # None: no port named
    if address.startswith("["):
        host, closed, rest = address[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError(_form(value, f"{server!r} is neither [IPv6] nor [IPv6]:PORT"))
        if not _is_ipv6(host):
            raise ValueError(_form(value, f"{host!r} in brackets{of} is not an IPv6 address"))
        port = rest[1:] if rest else None
    elif address.count(":") == 1:
        host, _, port = address.partition(":")
    elif ":" in address:  # an IPv6 address without brackets: librdkafka takes no port after it
        host = address
        if not _is_ipv6(host):
            raise ValueError(
                _form(value, f"{server!r} is neither HOST:PORT nor an IPv6 address (write [IPv6]:PORT)")
            )
    else:
        host = address
    if ":" not in host and not _is_host_name(host):
        raise ValueError(
            _form(
                value,
                f"{host!r} is not a host name (ASCII letters, digits, '-' and '_' in "
                "labels of at most 63 between dots) or an IP address",
            )
        )
    if port is None:
        return BrokerAddress(scheme, host, KAFKA_PORT)
    if not (_PORT.fullmatch(port) and 0 < int(port) < 65536):
        raise ValueError(_form(value, f"the port {port!r}{of} is not a number from 1 to 65535"))
    return BrokerAddress(scheme, host, int(port))


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _is_host_name(host: str) -> bool:
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)
