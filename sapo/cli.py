"""The `sapo` command for people: one function per subcommand, registered in `SUBCOMMANDS`.

To add a subcommand, write `_add_<name>_arguments(parser)` and `_run_<name>(args) -> int`, then append
a `Subcommand` to the table. Machine-readable results go to stdout, diagnostics to stderr.

The swarm and experiment subcommands import their modules inside their functions: those pull in torch
and transformers (seconds), which `sapo broker`, `sapo topics` and `--help` never need.
"""

from __future__ import annotations

import argparse
import functools
import logging
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from confluent_kafka import KafkaError, KafkaException
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sapo.broker import DEFAULT_HOST, STORAGE_URL, BrokerError, EmbeddedBroker
from sapo.cliargs import (
    check_brokers,
    message_bytes,
    positive_int,
    positive_seconds,
    topic_prefix,
)
from sapo.clientlog import LIBRDKAFKA_LOG
from sapo.conformance import cli as conformance_cli
from sapo.experiment.shipped import scenario_names
from sapo.identity import cli as keys_cli
from sapo.inspect import cli as inspect_cli
from sapo.inspect.reader import InspectError
from sapo.kafka import KafkaPublisher
from sapo.kafkaargs import add_connection_arguments, brokers_source, load_connection_settings
from sapo.settings import ConfigError, KafkaConnection
from sapo.swarm import report
from sapo.topics import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PREFIX,
    WORK_PARTITIONS,
    TopicError,
    TopicNames,
    TopicSpec,
    ensure_topics,
    validate_node_id,
)

log = logging.getLogger("sapo.cli")


@dataclass(frozen=True)
class Subcommand:
    """One `sapo <name>` subcommand: how to declare its arguments and how to run it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _node_id(value: str) -> str:
    """argparse type: a valid node id, or a usage error that says what is allowed."""
    try:
        return validate_node_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- sapo broker ---------------------------------------------------------------------------------


def _port(value: str) -> int:
    """argparse type: a TCP port to listen on."""
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"must be 1..65535 (leave --port out for a free one), got {port}")
    return port


def _add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=_port, default=None, help="port to listen on (default: a free one)")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help="address to listen on and advertise (default: %(default)s)"
    )
    parser.add_argument(
        "--storage",
        default=STORAGE_URL,
        help="memory://tansu/ (default; gone on exit) or s3://BUCKET/ (durable; AWS_ACCESS_KEY_ID,"
        " AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION and, for a local S3, AWS_ENDPOINT_URL from the"
        " environment)",
    )
    parser.add_argument(
        "--cluster-id",
        default=None,
        help="fixed cluster id; with s3:// storage, give the same one to find the data again after a"
        " restart (default: a fresh one per start)",
    )


def _run_broker(args: argparse.Namespace) -> int:
    """Run the embedded broker until SIGINT/SIGTERM; print `bootstrap=HOST:PORT` once it answers."""
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping the broker", signal.Signals(signum).name)
        stop.set()

    try:
        broker = EmbeddedBroker(
            port=args.port, host=args.host, storage=args.storage, cluster_id=args.cluster_id
        )
    except ValueError as exc:  # bad storage settings: say what to set, before anything starts
        log.error("%s", exc)
        return 2
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with broker:
            print(f"bootstrap={broker.bootstrap}", flush=True)
            log.info("broker log: %s", broker.log_path)
            while not stop.wait(0.5):
                if not broker.is_running():
                    log.error("the broker exited unexpectedly; see %s", broker.log_path)
                    return 1
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


# --- sapo topics ---------------------------------------------------------------------------------


class TopicsSettings(BaseSettings):
    """The cluster `sapo topics` creates the topics on (`SAPO_TOPICS_KAFKA__*`)."""

    model_config = SettingsConfigDict(
        env_prefix="SAPO_TOPICS_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    kafka: KafkaConnection = Field(default_factory=KafkaConnection, description="The cluster.")


TOPICS_DESCRIPTION = """create the swarm and node topics (idempotent)

    sapo topics --bootstrap HOST:PORT --node node-0 --node node-1

The connection comes from SAPO_TOPICS_KAFKA__* (as for the services: BOOTSTRAP_SERVERS,
SECURITY_PROTOCOL, SASL_*, SSL_*), overridden by the flags below; the SASL password and the TLS key
password only from the environment or a file:

    SAPO_TOPICS_KAFKA__SASL_PASSWORD=... sapo topics --bootstrap HOST:9096 --security-protocol SASL_SSL \\
        --sasl-mechanism SCRAM-SHA-512 --sasl-username admin --node node-0
"""


def _add_topics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = TOPICS_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    conn = add_connection_arguments(parser, "SAPO_TOPICS_KAFKA__*")
    conn.add_argument(
        "--timeout", type=positive_seconds, default=30.0, help="seconds to wait for the cluster"
    )
    parser.add_argument(
        "--node", dest="nodes", action="append", type=_node_id, required=True, help="node id (repeatable)"
    )
    parser.add_argument(
        "--partitions", type=positive_int, default=1, help="partitions of the swarm, rollout and DLQ topics"
    )
    parser.add_argument(
        "--work-partitions",
        type=positive_int,
        default=WORK_PARTITIONS,
        help="partitions of each work topic: the most generator replicas per node (default: %(default)s)",
    )
    parser.add_argument("--replication-factor", type=positive_int, default=1, help="replicas per partition")
    parser.add_argument(
        "--max-message-bytes",
        type=message_bytes,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="max.message.bytes of every topic: the services' MAX_MESSAGE_BYTES (default: %(default)s)",
    )
    parser.add_argument(
        "--prefix", type=topic_prefix, default=DEFAULT_PREFIX, help="topic name prefix (default: %(default)s)"
    )


def _run_topics(args: argparse.Namespace) -> int:
    """Create the swarm topic and each node's topics if missing; print one line per topic."""
    settings = load_connection_settings(TopicsSettings, args, {})
    try:
        specs: list[TopicSpec] = []
        for node in args.nodes:
            names = TopicNames.for_node(node, prefix=args.prefix)
            specs += names.specs(
                args.partitions, args.replication_factor, args.work_partitions, args.max_message_bytes
            )
        created = set(ensure_topics(settings.kafka.to_librdkafka(), specs, timeout_s=args.timeout))
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    except TopicError as exc:
        # Raised from the client's error when the cluster never answered: say what to change.
        unreached = isinstance(exc.__cause__, KafkaException)
        log.error("%s%s", exc, f"; {_unreached_hint(args)}" if unreached else "")
        return 1
    for name in dict.fromkeys(spec.name for spec in specs):
        print(f"{'created' if name in created else 'exists'} {name}")
    return 0


def _unreached_hint(args: argparse.Namespace) -> str:
    return (
        f"check that {brokers_source(TopicsSettings, args)} reaches the cluster and that the security "
        "settings (--security-protocol, --sasl-*, --ssl-* or SAPO_TOPICS_KAFKA__*) match its listener"
    )


def _add_swarm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", type=Path, required=True, help="swarm manifest (YAML)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where logs, checkpoints and results go (default runs/<name>-<time>)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every node in this process without Kafka (lock-step only; for quick sweeps)",
    )


def _run_swarm(args: argparse.Namespace) -> int:
    from sapo.swarm.manifest import load_manifest
    from sapo.swarm.run import run_local

    manifest = load_manifest(args.manifest)
    if manifest.bootstrap is not None and not args.in_process:
        try:  # before any service starts: each would wait out its timeouts on a name that never resolves
            check_brokers(manifest.bootstrap)
        except ValueError as exc:
            raise ConfigError(f"bootstrap of swarm manifest {args.manifest}: {exc}") from None
    run_dir = (args.run_dir or Path("runs") / f"{manifest.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    return run_local(manifest, run_dir, in_process=args.in_process)


MAX_SEED = 2**53
"""The largest experiment seed: every node's stream seed (1000 x seed + node) stays a 63-bit integer."""


def _seeds(text: str) -> tuple[int, ...]:
    """argparse type of `--seeds`: comma-separated integers 0..MAX_SEED (a negative seed was refused
    only as a node's SAPO_GENERATOR_NODE_SEED, with a number the user never typed)."""
    seeds = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not (part.isascii() and part.isdigit()) or int(part) > MAX_SEED:
            raise argparse.ArgumentTypeError(f"seeds are integers 0..{MAX_SEED}, e.g. 0,1,2; got {part!r}")
        seeds.append(int(part))
    return tuple(seeds)


def _add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        "--profile",
        default="cpu",
        help=f"a shipped scenario ({', '.join(scenario_names())}) or the path of a scenario file "
        "(default cpu)",
    )
    parser.add_argument("--out", type=Path, required=True, help="results directory (re-run to resume)")
    parser.add_argument("--configs", default=None, help="configurations to run, e.g. 8/0,4/4 (default: all)")
    parser.add_argument("--seeds", type=_seeds, default=None, help="e.g. 0,1,2 (default: the scenario's)")
    parser.add_argument(
        "--rounds", type=positive_int, default=None, help="rounds per run (default: the scenario's)"
    )
    parser.add_argument(
        "--nodes", type=positive_int, default=None, help="nodes per swarm (one-group scenarios)"
    )
    parser.add_argument("--model", default=None, help="model ref of every node ({seed} = experiment seed)")
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a manifest key for every node, e.g. learning_rate=5e-4 or sampler.selection=reward_guided",
    )
    parser.add_argument(
        "--eval-questions", type=positive_int, default=None, help="held-out questions per policy"
    )
    parser.add_argument(
        "--eval-samples", type=positive_int, default=None, help="samples per held-out question"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="run swarms without Kafka (the same core functions)"
    )
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="run the scenario's `confirm` configuration at its first seed through the Kafka services",
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--plan-only", action="store_true", help="write experiment.json and every run's manifest, run nothing"
    )
    only.add_argument("--report-only", action="store_true", help="rewrite the report from finished runs")
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep each run's final checkpoints")


def _run_experiment(args: argparse.Namespace) -> int:
    from sapo.experiment.plan import load_scenario, parse_assignment, recorded_scenario, select, widened
    from sapo.experiment.runner import Mode, run_experiment, write_plan, write_scenario_report

    overrides = dict(parse_assignment(a) for a in args.assignments)
    overrides |= {k: v for k, v in (("rounds", args.rounds), ("model", args.model)) if v is not None}
    evaluation = {
        k: v for k, v in (("questions", args.eval_questions), ("samples", args.eval_samples)) if v is not None
    }
    base = load_scenario(args.scenario)
    scenario = select(
        base,
        configs=[c.strip() for c in args.configs.split(",")] if args.configs else None,
        seeds=args.seeds,
        overrides=overrides,
        nodes=args.nodes,
        evaluation=evaluation,
    )
    out_dir: Path = args.out.resolve()
    mode: Mode = "inprocess" if args.in_process else "services"
    command = (
        "sapo " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["experiment"] else ""
    )
    recorded = recorded_scenario(out_dir / "experiment.json")
    if args.report_only:  # the scenario as it was run, when the directory records one
        print(write_scenario_report(recorded or scenario, out_dir))
        return 0
    whole = widened(base, scenario, recorded, nodes=args.nodes)
    if args.plan_only:
        runs = write_plan(whole, out_dir)
        print(f"wrote {out_dir / 'experiment.json'} and {runs} manifests")
        return 0
    return run_experiment(
        scenario,
        out_dir,
        mode=mode,
        command=command,
        keep_checkpoints=args.keep_checkpoints,
        out=sys.stdout,
        confirm=args.confirm,
        recorded_as=whole,
    )


def _publish_record(
    config: dict[str, str], topic: str, key: bytes, value: bytes, timeout_s: float
) -> tuple[int, int]:
    """One record, acknowledged (`sapo keys announce` and `revoke`); DeliveryError when it is not."""
    publisher = KafkaPublisher(config, setting="--bootstrap or SAPO_KEYS_KAFKA__BOOTSTRAP_SERVERS")
    return publisher.send_sync(topic, key, value, timeout_s=timeout_s)


def _add_results_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=Path("results"), help="results root (default results)")


def _run_results(args: argparse.Namespace) -> int:
    from sapo.experiment.results import write_results_table

    print(write_results_table(args.root))
    return 0


def _add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run directory of `sapo swarm`")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="where the plot goes (default RUN_DIR/contributions.png)",
    )
    parser.add_argument("--no-plot", action="store_true", help="print the table only")


def _run_report(args: argparse.Namespace) -> int:
    if not args.run_dir.is_dir():
        log.error(
            "%s is no directory: give a run directory of `sapo swarm` (runs/<name>-<time>)", args.run_dir
        )
        return 1
    try:
        totals = report.contribution_totals(args.run_dir)
        intake = report.intake_totals(args.run_dir)
    except (ValueError, KeyError, TypeError) as exc:  # a record damaged or of another shape
        log.error(
            "%s: a step record is not what `sapo swarm` writes (%s: %s)",
            args.run_dir,
            type(exc).__name__,
            exc,
        )
        return 1
    if not totals:
        log.error(
            "no contributions recorded under %s/steps: not a run directory, or no step trained", args.run_dir
        )
        return 1
    report.print_table(totals, sys.stdout)
    if intake:
        report.print_intake(intake, sys.stdout)
    if not args.no_plot:
        path = args.plot or args.run_dir / "contributions.png"
        report.plot(totals, path)
        log.info("wrote %s", path)
    return 0


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("broker", "run the embedded Kafka-API broker (tansu)", _add_broker_arguments, _run_broker),
    Subcommand("topics", "create the swarm and node topics (idempotent)", _add_topics_arguments, _run_topics),
    Subcommand("swarm", "run a local swarm of nodes end to end", _add_swarm_arguments, _run_swarm),
    Subcommand(
        "keys",
        "node keys, trust lists and key announcements",
        keys_cli.add_arguments,
        functools.partial(keys_cli.run, publish=_publish_record),
    ),
    Subcommand(
        "inspect",
        "read or follow sapo topics decoded (table or JSON lines), filtered, or summarized",
        inspect_cli.add_arguments,
        inspect_cli.run,
    ),
    Subcommand(
        "conformance",
        "drive a running generator, sampler or trainer through the contract; a pass/fail table",
        conformance_cli.add_arguments,
        conformance_cli.run,
    ),
    Subcommand(
        "report",
        "per-peer contributions to each node's training in a run directory: a table and a plot",
        _add_report_arguments,
        _run_report,
    ),
    Subcommand(
        "experiment",
        "a scenario's configurations over seeds, with a results report",
        _add_experiment_arguments,
        _run_experiment,
    ),
    Subcommand(
        "results",
        "the table across experiments in <root>/README.md",
        _add_results_arguments,
        _run_results,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sapo", description="SAPO swarm tools.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(command_parser)
        command_parser.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        # Commands report connection failures themselves; librdkafka's per-retry lines are noise.
        LIBRDKAFKA_LOG.setLevel(logging.CRITICAL)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except (ConfigError, argparse.ArgumentTypeError) as exc:
        log.error("%s", exc)
        return 2
    # A path, a host or a cluster given wrong: the failure's own words, not a traceback.
    except (OSError, KafkaException, InspectError, TopicError) as exc:
        log.error("%s", user_message(exc), exc_info=args.verbose)
        return 1


def user_message(exc: Exception) -> str:
    """What a user reads for a failure of what they gave: the OS's words with the path or host, the
    Kafka client's own text (not its error object's repr)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return f"Kafka client: {exc.args[0].str()}"
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}: {where}" if where else exc.strerror
    return str(exc)


if __name__ == "__main__":
    raise SystemExit(main())
