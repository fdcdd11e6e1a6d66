"""The conformance kit against real service processes on the real broker: the project's three
services conform; a deliberately broken variant of each fails with a readable reason.

The sampler runs are driven through the `sapo conformance` command (exit status and table); the
others call the kit's entry point in this process, which the command wraps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sapo.conformance import trainer as trainer_scenario
from sapo.conformance.cli import run_kit
from sapo.conformance.common import GeneratorTarget, check_lease
from sapo.conformance.observe import Tail
from sapo.conformance.results import Results, Status
from sapo.identity import NodeKey
from sapo.identity.keys import write_private
from sapo.identity.trustlist import TrustList, build_store
from sapo.kafka import Record
from sapo.kafka.dlq import H_REASON, H_SOURCE
from sapo.topics import TopicNames, ensure_topics
from sapo.v1 import batch_pb2, lease_pb2, policy_pb2
from sapo.wire import SCHEMA_VERSION, InvalidMessageError, decode, message_headers
from tests.conformance.launch import MODEL, NODE, QUESTIONS, ROOT, running, target
from tests.integration.raw_producer import produce_raw

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Broken:
    """A broken variant (`python -m tests.conformance.broken_<service> MODE`), the check it must fail
    and words its reason must contain."""

    mode: str
    check: str
    reason: str

    def __str__(self) -> str:
        return self.mode


def _kit_cli(bootstrap: str, prefix: str, service: str) -> subprocess.CompletedProcess[str]:
    kit = ["conformance", service, "--bootstrap", bootstrap, "--node", NODE, "--prefix", prefix]
    cmd = [
        sys.executable,
        "-m",
        "sapo.cli",
        *kit,
        "--timeout",
        "150",
        "--quiet",
        "3",
        "--questions-per-round",
        str(QUESTIONS),
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "200", "SAPO_CONFORMANCE_FETCH_WAIT_MAX_MS": "50"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)


def _failed(results: Results) -> dict[str, str]:
    return {c.name: c.detail for c in results.checks if c.status is Status.FAIL}


def _generator_setup(tmp_path: Path) -> tuple[dict[str, str], GeneratorTarget]:
    """A node key for the generator to sign with, and the trust list the kit verifies against."""
    key = NodeKey.generate()
    write_private(tmp_path / "node.pem", key)
    trust = build_store(TrustList(nodes={NODE: (key.public_text,)}), tofu=False, max_pinned_nodes=0)
    settings = {"IDENTITY__PRIVATE_KEY_FILE": str(tmp_path / "node.pem")}
    return settings, GeneratorTarget(MODEL, str(tmp_path / "checkpoints"), trust)


def test_the_sampler_conforms_and_one_that_commits_pooled_groups_does_not(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    with running("sampler", "services.sampler.main", kafka_bootstrap, topic_prefix, tmp_path / "good.log"):
        good = _kit_cli(kafka_bootstrap, topic_prefix, "sampler")
    assert good.returncode == 0, good.stdout + good.stderr + (tmp_path / "good.log").read_text()[-3000:]
    assert "sampler node-under-test: conformant (18 passed, 0 failed, 0 skipped)" in good.stdout
    assert "refuses what it must" in good.stdout and "§8.2" in good.stdout

    prefix = topic_prefix + ".broken"
    log = tmp_path / "broken.log"
    with running("sampler", "tests.conformance.broken_sampler", kafka_bootstrap, prefix, log):
        bad = _kit_cli(kafka_bootstrap, prefix, "sampler")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    [line] = [line for line in bad.stdout.splitlines() if "commits only finished input" in line]
    assert "FAIL" in line and "§5.3" in line and "was pooled and in no batch" in bad.stdout
    assert "NOT conformant (17 passed, 1 failed" in bad.stdout


def test_the_trainer_conforms(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    settings = {"CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    with running(
        "trainer", "services.trainer.main", kafka_bootstrap, topic_prefix, tmp_path / "log", settings=settings
    ):
        results = run_kit(target("trainer", kafka_bootstrap, topic_prefix))
    assert results.passed, results.to_json() + (tmp_path / "log").read_text()[-3000:]
    assert len(results.checks) == 17
    # Every refusal of contract sections 9.1 and 9.2 but `epoch_beyond_leases` (a check of its own).
    refusals = next(c.detail for c in results.checks if c.name == "dead-letters malformed input")
    reasons = (
        "fenced_batch, late_batch, missing_source, nonfinite_advantage, reward_length_mismatch, "
        "sequence_gap_too_large, too_many_completions, too_many_groups, undecodable, wrong_node"
    )
    assert f"10 dead letters on {TopicNames.for_node(NODE, topic_prefix).dlq} ({reasons})" in refusals
    # The kit's batches carry the epoch of a sampler lease it took, as a real sampler's do, but the one
    # no lease can have given.
    epochs = _sampler_acquisitions(kafka_bootstrap, topic_prefix)
    sent = set(_batch_epochs(kafka_bootstrap, topic_prefix)) - {trainer_scenario.EPOCH_BEYOND_LEASES}
    assert epochs and max(sent) in epochs


def _records(bootstrap: str, topic: str) -> list[Record]:
    tail = Tail({"bootstrap.servers": bootstrap}, [topic], 10.0)
    try:
        tail.wait(lambda: tail.on(topic) or None, 10.0)
        tail.pump(1.0)  # the rest, written before the first
        return tail.on(topic)
    finally:
        tail.close()


def _sampler_acquisitions(bootstrap: str, prefix: str) -> set[int]:
    """The epochs of the sampler lease's acquisitions on the node's leases topic."""
    records = _records(bootstrap, TopicNames.for_node(NODE, prefix).leases)
    leases = [(r.offset, decode(lease_pb2.Lease, r.value, 1 << 16)) for r in records]
    return {offset + 1 for offset, lease in leases if lease.role == "sampler" and lease.epoch == 0}


def _batch_epochs(bootstrap: str, prefix: str) -> list[int]:
    """The epochs of the node's batches that decode."""
    epochs = []
    for record in _records(bootstrap, TopicNames.for_node(NODE, prefix).batches):
        with contextlib.suppress(InvalidMessageError):
            epochs.append(decode(batch_pb2.TrainingBatch, record.value, 1 << 24).epoch)
    return epochs


@pytest.mark.parametrize(
    "case",
    [
        Broken("twice", "never trains a batch twice", "trained into versions"),
        pytest.param(
            Broken("no-checkpoint", "version 1 is durable before it is announced", "cannot be read"),
            marks=pytest.mark.slow,
        ),
        Broken("early-commit", "commits only durable work", "before batches ['node-under-test/0']"),
        Broken(
            "no-epochs",
            "trains a batch into the next version",
            "dead-lettered it as 'epoch_beyond_leases': batch node-under-test/0 of sampler epoch",
        ),
        pytest.param(
            Broken("any-epoch", "refuses an epoch no lease gave", "trained into version 3"),
            marks=pytest.mark.slow,
        ),
    ],
    ids=str,
)
def test_a_broken_trainer_fails(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, case: Broken
) -> None:
    mode, check, reason = case.mode, case.check, case.reason
    settings = {"CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    log = tmp_path / "log"
    module = "tests.conformance.broken_trainer"
    with running("trainer", module, kafka_bootstrap, topic_prefix, log, settings=settings, args=[mode]):
        results = run_kit(target("trainer", kafka_bootstrap, topic_prefix))
    assert list(_failed(results)) == [check], results.to_json() + log.read_text()[-3000:]
    assert reason in _failed(results)[check]


def test_the_generator_conforms(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    settings, extra = _generator_setup(tmp_path)
    log = tmp_path / "log"
    with running(
        "generator", "services.generator.main", kafka_bootstrap, topic_prefix, log, settings=settings
    ):
        results = run_kit(target("generator", kafka_bootstrap, topic_prefix), extra)
    assert results.passed, results.to_json() + log.read_text()[-3000:]
    assert [c.status for c in results.checks].count(Status.PASS) == 13


@pytest.mark.parametrize(
    "case",
    [
        Broken("versions", "waits for the version an item needs", "while only version 0 was announced"),
        pytest.param(Broken("unsigned", "signs shared groups", "unsigned"), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_a_broken_generator_fails(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, case: Broken
) -> None:
    mode, check, reason = case.mode, case.check, case.reason
    settings, extra = _generator_setup(tmp_path)
    log = tmp_path / "log"
    module = "tests.conformance.broken_generator"
    with running("generator", module, kafka_bootstrap, topic_prefix, log, settings=settings, args=[mode]):
        results = run_kit(target("generator", kafka_bootstrap, topic_prefix), extra)
    failed = _failed(results)
    assert check in failed, results.to_json() + log.read_text()[-3000:]
    assert reason in failed[check]


@contextlib.contextmanager
def _kit_and_trainer_group(
    bootstrap: str, prefix: str, fetch_wait_ms: int
) -> Iterator[tuple[trainer_scenario._Run, Consumer]]:
    """The trainer scenario's observer over a fresh node's topics, and a client that commits as the
    trainer's consumer group."""
    kit = dataclasses.replace(target("trainer", bootstrap, prefix), fetch_wait_max_ms=fetch_wait_ms)
    ensure_topics({"bootstrap.servers": bootstrap}, kit.topics.specs(), timeout_s=30)
    run = trainer_scenario._Run(kit, Results("trainer", NODE))
    trainer = Consumer({"bootstrap.servers": bootstrap, "group.id": kit.group("trainer")})
    try:
        yield run, trainer
    finally:
        trainer.close()
        run.close()


def _commit_and_observe(run: trainer_scenario._Run, trainer: Consumer, offset: int) -> None:
    """Commit the batch topic past `offset` as the trainer's group, and expect the kit to see that
    commit and call it no early one."""
    trainer.commit(offsets=[TopicPartition(run.topics.batches, 0, offset + 1)], asynchronous=False)
    run.observe_commit()
    assert run.commit_seen == offset + 1
    assert run.commit_problems == []


def test_a_commit_made_after_its_announcement_is_never_taken_for_an_early_one(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A fetch the kit has in flight when the trainer announces may hold the announcement for up to the
    kit's fetch wait (the embedded broker answers a fetch only when its wait ends): an observation of
    the commit that follows must read that long before it calls the commit early."""
    fetch_wait_ms = 6000
    with _kit_and_trainer_group(kafka_bootstrap, topic_prefix, fetch_wait_ms) as (run, trainer):
        topics = run.topics
        # Just after a fetch returned: the next one is in flight, held for its wait.
        run.out.send(topics.work, b"0/0", b"marker")
        assert run.tail.wait(lambda: run.tail.on(topics.work) or None, 4 * fetch_wait_ms / 1000)
        batch = run.batch(0, groups=0)
        _, _, offset = run.send_batch(batch)
        update = policy_pb2.PolicyUpdate(
            schema_version=SCHEMA_VERSION, node_id=NODE, version=1, batch_id=batch.batch_id
        )
        value = update.SerializeToString()
        run.out.send(topics.policy, NODE.encode(), value, message_headers("PolicyUpdate", NODE, value))
        # As a conforming trainer does: the version is announced (acknowledged), then its batch committed.
        _commit_and_observe(run, trainer, offset)


def test_a_batch_committed_once_dead_lettered_is_not_an_early_commit(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """Refusing a batch finishes it (contract section 5.5): committing past its dead letter is no
    commit before a version, whatever the kit reports about the refusal itself."""
    with _kit_and_trainer_group(kafka_bootstrap, topic_prefix, 50) as (run, trainer):
        topics = run.topics
        batch = run.batch(0, groups=0)
        batch_topic, partition, offset = run.send_batch(batch)
        source = f"{batch_topic}/{partition}/{offset}".encode()
        run.out.send(topics.dlq, batch.batch_id.encode(), b"", [(H_REASON, b"x"), (H_SOURCE, source)])
        _commit_and_observe(run, trainer, offset)


def test_a_version_not_announced_in_time_says_whether_the_trainer_s_group_had_joined(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A trainer whose consumer group committed nothing and has no member that finished joining has
    read no batch: the kit says so, not only that no version came. The member here joins with
    librdkafka's default group timing, as a trainer that does not set it: 22.5 s on the embedded
    broker (half the 45 s session timeout), 3 s on Apache Kafka's defaults; the kit looks within 2 s."""
    with _kit_and_trainer_group(kafka_bootstrap, topic_prefix, 50) as (run, trainer):
        position = run.send_batch(run.batch(0, groups=0))
        _, why = run.trained(1, position, 0.5)
        assert f"{run.t.group('trainer')} committed nothing on {run.topics.batches} and has no member" in why
        trainer.subscribe([run.topics.batches])
        trainer.poll(0.2)
        _, why = run.trained(1, position, 0.5)
    assert "and no member has finished joining it (state " in why, why
    assert "raise --timeout" in why


@pytest.mark.parametrize("service", ["sampler", "generator"])
def test_no_first_output_in_time_says_which_of_the_service_s_groups_had_joined(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, service: str
) -> None:
    """As for the trainer: a sampler or generator that made nothing of its first input in time is
    described by each of its consumer groups that committed nothing. Here the first has a member still
    joining it with librdkafka's default group timing, and the sampler's swarm group has none."""
    kit = dataclasses.replace(target(service, kafka_bootstrap, topic_prefix), timeout_s=2.0)
    ensure_topics({"bootstrap.servers": kafka_bootstrap}, kit.topics.specs(), timeout_s=30)
    topics = kit.topics
    if service == "sampler":
        check, extra = "emits a batch per round", None
        (joining, topic), *empty = [
            (kit.group("sampler"), topics.rollouts),
            (kit.group("sampler-swarm"), topics.swarm_rollouts),
        ]
    else:
        check, extra = "one group per work item", GeneratorTarget(MODEL, str(tmp_path / "checkpoints"))
        (joining, topic), *empty = [(kit.group("generator"), topics.work)]
    # A static member: closing a dynamic one mid-join waits 5 s for its LeaveGroup.
    member = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": joining, "group.instance.id": "kit-test"}
    )
    try:
        member.subscribe([topic])
        member.poll(0.2)
        results = run_kit(kit, extra)
    finally:
        member.close()
    assert list(_failed(results)) == [check], results.to_json()
    why = _failed(results)[check]
    assert f"{joining} committed nothing on {topic} and no member has finished joining it (state " in why, why
    assert all(f"{group} committed nothing on {topic} and has no member" in why for group, topic in empty), (
        why
    )
    assert f"raise --timeout, or shorten the {service}'s session.timeout.ms" in why


def test_lease_records_a_reader_refuses_fail_the_lease_check_and_hold_nothing(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A trainer's lease records that the services' readers refuse (a ttl out of bounds, an epoch ahead
    of its own record, a header name that is not UTF-8) fail the kit's lease check, each named, and
    are folded as those readers fold them: not at all."""

    def lease(**fields: float) -> bytes:
        record = lease_pb2.Lease(
            schema_version=SCHEMA_VERSION, node_id=NODE, role="trainer", owner="t-1", ttl_s=30.0
        )
        for name, value in fields.items():
            setattr(record, name, value)
        record.renewed_at.GetCurrentTime()
        return record.SerializeToString()

    with _kit_and_trainer_group(kafka_bootstrap, topic_prefix, 50) as (run, _trainer):
        leases = run.topics.leases
        for value in (lease(), lease(ttl_s=float("inf"), epoch=1), lease(epoch=99)):  # offsets 0, 1, 2
            run.out.send(leases, b"trainer", value, message_headers("Lease", NODE, value))
        produce_raw(kafka_bootstrap, leases, b"trainer", lease(epoch=4), [(b"\xff\xfe", b"1")])
        run.tail.wait(lambda: len(run.tail.on(leases)) == 4, 20.0)
        results = Results("trainer", NODE)
        check_lease(results, run.tail, run.topics, "trainer", {"version 1": 1})
    failed = _failed(results)
    assert list(failed) == ["writes valid trainer lease records"], results.to_json()
    detail = failed["writes valid trainer lease records"]
    assert all(f"/0/{offset}: " in detail for offset in (1, 2, 3)), detail
    assert "lease_ttl_out_of_range" in detail and "lease_epoch_ahead" in detail and "not UTF-8" in detail
    held = next(c for c in results.checks if c.name == "holds the trainer lease")
    assert "epoch 1 held by t-1" in held.detail
