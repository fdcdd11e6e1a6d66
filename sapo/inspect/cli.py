"""`sapo inspect`: read or follow sapo topics decoded, as a table or JSON lines, or summarize them.

    sapo inspect --bootstrap HOST:PORT swarm                       # the swarm topic, up to now
    sapo inspect --bootstrap HOST:PORT node-0/dlq --reason oversized --json
    sapo inspect --bootstrap HOST:PORT node-0 --last 20            # every topic of node-0
    sapo inspect --bootstrap HOST:PORT swarm --from-end --node node-2 --round 5..
    sapo inspect --bootstrap HOST:PORT all --summary               # counts, rates, sizes

TOPIC is a topic name, `swarm` (`<prefix>.swarm.rollouts`), `keys` (`<prefix>.swarm.keys`),
`NODE/ROLE` (`<prefix>.node.NODE.ROLE`: rollouts, batches, policy, dlq, work, leases), `NODE` (every topic of
that node; an argument that is a node id reads as one) or `all` (every topic under the prefix). The
connection comes from `SAPO_INSPECT_KAFKA__*` (as for the services: `SECURITY_PROTOCOL`, `SASL_*`,
`SSL_*`), overridden by the flags below; the SASL password and the TLS key password only from the
environment or a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from sapo.cliargs import positive_int, positive_seconds, wall_seconds
from sapo.inspect.decode import to_entry
from sapo.inspect.query import Filter, IntRange
from sapo.inspect.reader import Bounds, InspectError, Start, Stats, TopicReader, read
from sapo.inspect.render import JsonLines, SummaryView, TableRows, console_for
from sapo.inspect.settings import InspectSettings
from sapo.kafka import TransportError
from sapo.kafkaargs import add_connection_arguments, load_connection_settings
from sapo.lifecycle import StopFlag, install_signal_handlers
from sapo.settings import ConfigError
from sapo.topics import NODE_ID_RE, validate_node_id, validate_topic_name

log = logging.getLogger("sapo.cli")

NODE_ROLES: Final = ("rollouts", "batches", "policy", "dlq", "work", "leases")
_DURATION_RE: Final = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def topic_spec(spec: str) -> str:
    """`spec` if it is a TOPIC argument (module docstring), else ValueError saying what is allowed."""
    if spec in ("swarm", "keys", "all") or NODE_ID_RE.fullmatch(spec):
        return spec
    node, slash, role = spec.partition("/")
    if slash:
        validate_node_id(node)
        if role not in NODE_ROLES:
            raise ValueError(f"{spec!r}: the role after '/' is one of {', '.join(NODE_ROLES)}")
        return spec
    try:
        return validate_topic_name(spec)
    except ValueError:
        raise ValueError(
            f"{spec!r} is neither a node id nor a topic name: TOPIC is swarm, keys, all, NODE, NODE/ROLE "
            "or a Kafka topic name (1-249 ASCII letters, digits, '.', '_' and '-')"
        ) from None


def resolve_topics(specs: Sequence[str], prefix: str, existing: Callable[[], list[str]]) -> list[str]:
    """Topic names for the TOPIC arguments (module docstring), in order, each once. `existing` lists
    the cluster's topics; it is asked only for `NODE` and `all`."""
    names: list[str] = []
    for spec in map(topic_spec, specs):
        if spec == "swarm":
            names.append(f"{prefix}.swarm.rollouts")
        elif spec == "keys":
            names.append(f"{prefix}.swarm.keys")
        elif spec == "all":
            names += [t for t in existing() if t.startswith(f"{prefix}.")]
        elif "/" in spec:
            node, _, role = spec.partition("/")
            names.append(f"{prefix}.node.{node}.{role}")
        elif NODE_ID_RE.fullmatch(spec):
            mine = [t for t in existing() if t.startswith(f"{prefix}.node.{spec}.")]
            if not mine:
                raise ValueError(f"no topics of node {spec!r} under prefix {prefix!r}")
            names += mine
        else:
            names.append(spec)
    if not names:
        raise ValueError(f"no topics matched {' '.join(specs)} under prefix {prefix!r}")
    return list(dict.fromkeys(names))


def parse_since(text: str, now_s: float) -> int:
    """`--since`: `90s`, `10m`, `2h`, `1d` ago, or an ISO 8601 time (UTC when it has no zone); in ms,
    never before 1970: Kafka reads a negative time as a special offset (-1 the end, -2 the beginning) or
    refuses it."""
    match = _DURATION_RE.match(text.strip())
    if match:
        return max(0, int((now_s - float(match.group(1)) * _UNIT_S[match.group(2)]) * 1000))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r} is neither a duration (90s, 10m, 2h, 1d) nor an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0, int(moment.timestamp() * 1000))


def _topic(text: str) -> str:
    try:
        return topic_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _range(text: str) -> IntRange:
    try:
        return IntRange.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("topics", nargs="+", type=_topic, metavar="TOPIC", help="what to read (see above)")
    conn = add_connection_arguments(parser, "SAPO_INSPECT_KAFKA__*")
    conn.add_argument("--prefix", help="topic name prefix (default: SAPO_INSPECT_TOPIC_PREFIX or sapo)")
    where = parser.add_argument_group("where to start (default: the beginning)")
    start = where.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="every retained message")
    start.add_argument("--from-end", action="store_true", help="only messages that arrive from now (follows)")
    start.add_argument("--last", type=positive_int, metavar="N", help="the newest N matching messages")
    start.add_argument("--since", metavar="TIME", help="messages since 10m / 2h / 1d ago or an ISO time")
    until = parser.add_argument_group("when to stop (default: when nothing arrived for --idle)")
    until.add_argument("-f", "--follow", action="store_true", help="keep reading new messages (tail -f)")
    until.add_argument(
        "--max-messages", type=positive_int, metavar="N", help="stop after N matching messages"
    )
    until.add_argument("--duration", type=wall_seconds, metavar="S", help="stop after S seconds")
    until.add_argument(
        "--idle", type=positive_seconds, metavar="S", help="the end is S seconds without a message"
    )
    which = parser.add_argument_group("filters (repeat a flag for any of several values)")
    which.add_argument("--node", dest="nodes", action="append", default=[], help="producing/owning node")
    which.add_argument("--task", dest="tasks", action="append", default=[], help="task (dataset) name")
    which.add_argument("--round", dest="rounds", type=_range, help="round: 5, 3..7, 3.. or ..7")
    which.add_argument("--policy-version", dest="versions", type=_range, help="policy version (range)")
    which.add_argument("--reason", dest="reasons", action="append", default=[], help="dead-letter reason")
    out = parser.add_argument_group("output (default: a table)")
    out.add_argument("--json", action="store_true", help="JSON lines (with --summary: one JSON object)")
    out.add_argument("--summary", action="store_true", help="counts, rates and sizes per topic/node/task")
    out.add_argument("--payload", action="store_true", help="with --json: the whole decoded message")


def settings_from(args: argparse.Namespace) -> InspectSettings:
    """Environment first, flags over it; exits with what to set when the result is invalid (a bad value
    is named by the flag when a flag gave it)."""
    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}
    if args.prefix is not None:
        overrides["topic_prefix"], given["topic_prefix"] = args.prefix, "--prefix"
    if args.idle is not None:
        overrides["idle_s"], given["idle_s"] = args.idle, "--idle"
    return load_connection_settings(InspectSettings, args, given, **overrides)


def _start(args: argparse.Namespace) -> Start:
    if args.last is not None:
        return Start("last", count=args.last)
    if args.since is not None:
        return Start("since", since_ms=parse_since(args.since, time.time()))
    return Start("end") if args.from_end else Start("beginning")


def run(args: argparse.Namespace) -> int:
    if args.payload and not args.json:
        raise ConfigError("--payload needs --json (the table shows a one-line summary per message)")
    settings = settings_from(args)
    start = _start(args)
    bounds = Bounds(args.max_messages, args.duration, args.follow, settings.idle_s)
    keep = Filter(
        frozenset(args.nodes), frozenset(args.tasks), args.rounds, args.versions, frozenset(args.reasons)
    ).matches
    stop = StopFlag()
    install_signal_handlers(stop)
    reader = TopicReader(settings.consumer_config(), timeout_s=settings.timeout_s)
    try:
        topics = resolve_topics(args.topics, settings.topic_prefix, reader.topic_names)
        partitions = reader.partitions(topics)
        sink = _sink(args, follow=args.follow or start.mode == "end")
        try:
            stats = read(
                reader,
                partitions,
                start,
                bounds,
                convert=lambda record: to_entry(record, settings.max_message_bytes, args.payload),
                keep=keep,
                sink=sink,
                stop=stop,
            )
            if isinstance(sink, SummaryView):
                sink.extra.update(_stats_dict(stats))
        finally:
            sink.close()
    except (InspectError, TransportError, ValueError) as exc:
        log.error("%s", exc)
        return 1
    except BrokenPipeError:
        # The reader of our output went away (`| head`): that ends the read, it is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        reader.close()
    log.info(
        "read %d records from %d partitions of %s; %d before the start skipped, %d matched",
        stats.read,
        stats.partitions,
        ", ".join(topics) if len(topics) <= 3 else f"{len(topics)} topics",
        stats.skipped,
        stats.matched,
    )
    return 0


def _sink(args: argparse.Namespace, follow: bool) -> JsonLines | TableRows | SummaryView:
    console = console_for(sys.stdout)
    if args.summary:
        return SummaryView(console, follow, args.json, {})
    if args.json:
        return JsonLines(sys.stdout)
    return TableRows(console, follow)


def _stats_dict(stats: Stats) -> dict[str, int]:
    return dataclasses.asdict(stats)
