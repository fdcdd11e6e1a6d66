"""The services under test: a real process per service (the project's entrypoint or a broken variant),
configured as docs/contract.md section 11's conformance profile asks, on the test broker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sapo.conformance.common import Target
from sapo.settings import ConsumerProfile
from sapo.topics import TopicNames, ensure_topics

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-under-test"
MODEL = "tiny:0"
QUESTIONS = 3

PROFILE: Mapping[str, Mapping[str, str]] = {
    "sampler": {
        "QUESTIONS_PER_ROUND": str(QUESTIONS),
        "LOCAL_GROUPS": "2",
        "EXTERNAL_GROUPS": "2",
        "EXPECTED_PEERS": "2",
        "MAX_PER_SOURCE": "1",
        "LOCKSTEP_TIMEOUT_S": "10",
        "RECOVERY_IDLE_S": "1",
    },
    "trainer": {
        "MODEL": MODEL,
        "QUESTIONS_PER_ROUND": str(QUESTIONS),
        "CHECKPOINT_EVERY": "1",
        "STATE_EVERY": "1",
    },
    "generator": {
        "MODEL": MODEL,
        "COMPLETIONS_PER_QUESTION": "2",
        "MAX_NEW_TOKENS": "6",
        "POLICY_CATCHUP_IDLE_S": "1",
    },
}


def service_env(service: str, bootstrap: str, prefix: str, settings: Mapping[str, str]) -> dict[str, str]:
    profile = ConsumerProfile.local()
    common = {
        "NODE_ID": NODE,
        "KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "TOPIC_PREFIX": prefix,
        "CONSUMER__SESSION_TIMEOUT_MS": str(profile.session_timeout_ms),
        "CONSUMER__HEARTBEAT_INTERVAL_MS": str(profile.heartbeat_interval_ms),
        "CONSUMER__FETCH_WAIT_MAX_MS": str(profile.fetch_wait_max_ms),
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": "0",
        "LOG_FORMAT": "text",
        "LEASE_TTL_S": "6",
        "LEASE_READ_IDLE_S": "0.5",
    }
    if service == "generator":
        del common["LEASE_TTL_S"], common["LEASE_READ_IDLE_S"]
    prefix_env = f"SAPO_{service.upper()}_"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SAPO_")}
    values = common | dict(PROFILE[service]) | dict(settings)
    return (
        base
        | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        | {prefix_env + k: v for k, v in values.items()}
    )


def target(service: str, bootstrap: str, prefix: str) -> Target:
    config = {"bootstrap.servers": bootstrap}
    return Target(service, NODE, prefix, config, 150.0, 3.0, QUESTIONS, fetch_wait_max_ms=50)


@contextlib.contextmanager
def running(
    service: str,
    module: str,
    bootstrap: str,
    prefix: str,
    log: Path,
    *,
    settings: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[subprocess.Popen[bytes]]:
    """The node's topics created and `python -m module args` running until the block ends (SIGTERM,
    then SIGKILL after 30 s)."""
    specs = TopicNames.for_node(NODE, prefix).specs()
    ensure_topics({"bootstrap.servers": bootstrap}, specs, timeout_s=30)
    env = service_env(service, bootstrap, prefix, settings or {})
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
