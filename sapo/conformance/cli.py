"""`sapo conformance generator|sampler|trainer`: drive a running service through the contract
(docs/contract.md) and print a pass/fail table; exit status 0 when it conforms, 1 when not.

    sapo conformance sampler   --bootstrap HOST:PORT --node node-0 --prefix sapo
    sapo conformance trainer   --bootstrap HOST:PORT --node node-0
    sapo conformance generator --bootstrap HOST:PORT --node node-0 --model tiny:0 \\
                               --checkpoint-root s3://bucket/ckpt --trust-file trust.yaml

Start the service under test first, alone on its node (the kit plays every other service of the
node and the swarm's peers), with the conformance profile of docs/contract.md section 11. The
connection comes from `SAPO_CONFORMANCE_KAFKA__*` (as for the services: `SECURITY_PROTOCOL`,
`SASL_*`, `SSL_*`), overridden by the flags; the SASL and TLS key passwords only from the
environment or a file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Final

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sapo.cliargs import positive_int, positive_seconds
from sapo.conformance.common import GeneratorTarget, Target
from sapo.conformance.results import Results
from sapo.identity import IdentityError, TrustStore
from sapo.identity.trustlist import build_store, load_trust_list
from sapo.inspect.render import console_for
from sapo.kafkaargs import add_connection_arguments, load_connection_settings
from sapo.models.refs import ref_form_error
from sapo.settings import ConfigError, KafkaConnection
from sapo.storage import store_problem
from sapo.topics import validate_node_id

log = logging.getLogger("sapo.cli")
SERVICES: Final = ("generator", "sampler", "trainer")


class ConformanceSettings(BaseSettings):
    """The cluster the service under test uses (`SAPO_CONFORMANCE_KAFKA__*`) and the kit's patience."""

    model_config = SettingsConfigDict(
        env_prefix="SAPO_CONFORMANCE_", frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    kafka: KafkaConnection = Field(
        default_factory=lambda: KafkaConnection(client_id="sapo-conformance"), description="The cluster."
    )
    topic_prefix: str = Field("sapo", pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Prefix of topic names.")
    fetch_wait_max_ms: int = Field(100, ge=1, le=60_000, description="Longest a fetch of the kit waits.")
    timeout_s: float = Field(
        180.0, gt=0, le=3600, description="Longest wait for one reaction of the service (start-up included)."
    )
    quiet_s: float = Field(
        4.0, gt=0, le=600, description="How long the kit watches for something that must not happen."
    )
    questions_per_round: int = Field(
        3, ge=2, le=64, description="The service's questions per round (the conformance profile's 3)."
    )


def _node(value: str) -> str:
    try:
        return validate_node_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("service", choices=SERVICES, help="which service is under test")
    parser.add_argument("--node", required=True, type=_node, help="the node id the service runs as")
    conn = add_connection_arguments(parser, "SAPO_CONFORMANCE_KAFKA__*")
    conn.add_argument("--prefix", help="topic name prefix (default: SAPO_CONFORMANCE_TOPIC_PREFIX or sapo)")
    kit = parser.add_argument_group("the run")
    kit.add_argument(
        "--timeout", type=positive_seconds, help="longest wait for one reaction, s (default 180)"
    )
    kit.add_argument(
        "--quiet", type=positive_seconds, help="how long to watch for what must not happen, s (default 4)"
    )
    kit.add_argument("--questions-per-round", type=positive_int, help="the service's setting (default 3)")
    kit.add_argument("--json", action="store_true", help="print the verdicts as one JSON object")
    gen = parser.add_argument_group("generator only")
    gen.add_argument("--model", help="the generator's model ref: the kit announces versions of it")
    gen.add_argument("--checkpoint-root", help="where the generator reads checkpoints (a path or URL)")
    gen.add_argument(
        "--trust-file", type=Path, help="the swarm's trust list: check the generator's signatures"
    )


_FLAGS: Final = {
    "topic_prefix": ("prefix", "--prefix"),
    "timeout_s": ("timeout", "--timeout"),
    "quiet_s": ("quiet", "--quiet"),
    "questions_per_round": ("questions_per_round", "--questions-per-round"),
}
"""The settings a flag overrides: field -> (argparse dest, flag)."""


def settings_from(args: argparse.Namespace) -> ConformanceSettings:
    """Environment first, flags over it; a bad value is named by the flag when a flag gave it."""
    given = {field: flag for field, (dest, flag) in _FLAGS.items() if getattr(args, dest) is not None}
    overrides = {field: getattr(args, _FLAGS[field][0]) for field in given}
    return load_connection_settings(ConformanceSettings, args, given, **overrides)


def _trust(path: Path | None) -> TrustStore | None:
    if path is None:
        return None
    try:
        return build_store(load_trust_list(path), tofu=False, max_pinned_nodes=0)
    except (IdentityError, OSError, ValueError) as exc:
        raise ConfigError(f"--trust-file {path}: {exc}") from None


def generator_target(args: argparse.Namespace) -> GeneratorTarget:
    """What the generator kit needs besides the connection, checked before it starts (and loads torch):
    a usage error names the flag."""
    if not (args.model and args.checkpoint_root):
        raise ConfigError("the generator kit writes policy versions: pass --model and --checkpoint-root")
    error = ref_form_error(args.model)
    if error is not None:
        raise ConfigError(f"--model: {error}")
    problem = store_problem(args.checkpoint_root)
    if problem is not None:
        raise ConfigError(f"--checkpoint-root {args.checkpoint_root}: {problem}")
    return GeneratorTarget(args.model, args.checkpoint_root, _trust(args.trust_file))


def run_kit(target: Target, generator_target: GeneratorTarget | None = None) -> Results:
    """Drive the service named by `target.service`; the verdicts in order."""
    results = Results(target.service, target.node)
    if target.service == "generator":
        from sapo.conformance import generator

        if generator_target is None:
            raise ConfigError("the generator kit writes policy versions: pass --model and --checkpoint-root")
        generator.run(target, generator_target, results)
    elif target.service == "sampler":
        from sapo.conformance import sampler

        sampler.run(target, results)
    else:
        from sapo.conformance import trainer

        trainer.run(target, results)
    return results


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    target = Target(
        service=args.service,
        node=args.node,
        prefix=settings.topic_prefix,
        kafka=settings.kafka.to_librdkafka(),
        timeout_s=settings.timeout_s,
        quiet_s=settings.quiet_s,
        questions_per_round=settings.questions_per_round,
        fetch_wait_max_ms=settings.fetch_wait_max_ms,
    )
    extra = generator_target(args) if args.service == "generator" else None
    log.info(
        "driving the %s of node %s (prefix %s) through the contract",
        target.service,
        target.node,
        target.prefix,
    )
    results = run_kit(target, extra)
    if args.json:
        print(results.to_json())
    else:
        results.print(console_for(sys.stdout))
    return 0 if results.passed else 1
