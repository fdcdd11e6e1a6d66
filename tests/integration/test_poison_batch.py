"""A batch whose step fails on every try is quarantined after `max_step_attempts`, across restarts.

Through the real trainer process on the embedded broker: the third of four batches passes every
message check, and its step fails (`tests.integration.failing_trainer` injects the failure: what
quarantine is for is a step failing on a bug no check names). The trainer stops on it (its weights
must not go on half-updated), the restart fails on it again, and the restart after that finds the
attempts used up: the batch is dead-lettered as `poison_batch` with the step's error, the version
advances without it and the fourth batch is trained. The attempt count lives in the checkpoint
store, so it survives the processes.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sapo import wire
from sapo.checkpoints import CheckpointStore
from sapo.kafka import Disposition, Record
from sapo.models import load_bundled_tokenizer
from sapo.node.quarantine import RECORD
from sapo.v1 import policy_pb2
from tests.integration import trainer_support as ts
from tests.integration.kafka_helpers import make_loop
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.integration
POISONED = 2
ATTEMPTS = 2


def run_trainer(
    env: dict[str, str], log: Path, until: str | None = None, command: list[str] | None = None
) -> int:
    """Run the trainer (`command`, default the failing one) until it exits, or (with `until`) until its
    log shows `until`, then stop it."""
    command = command or [sys.executable, "-m", "tests.integration.failing_trainer", str(POISONED)]
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, cwd=ts.ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        if until is None:
            return process.wait(180)
        ts.wait_for(lambda: until in log.read_text(), 180, until, poll_s=0.2)
        process.terminate()
        return process.wait(60)
    finally:
        process.kill()


def test_a_batch_that_fails_every_step_is_quarantined_and_the_node_goes_on(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    tokenizer = load_bundled_tokenizer()
    batches = ts.make_batches(b.tiny(tokenizer), tokenizer, b.questions(2), count=4)
    ts.publish(kafka_bootstrap, topics.batches, batches)
    env = ts.trainer_env(kafka_bootstrap, topic_prefix, tmp_path)
    env["SAPO_TRAINER_MAX_STEP_ATTEMPTS"] = str(ATTEMPTS)

    for attempt in range(1, ATTEMPTS + 1):
        log = tmp_path / f"attempt-{attempt}.log"
        assert run_trainer(env, log) != 0, log.read_text()
        assert f"step of batch node-a/{POISONED} failed" in log.read_text()
    record = (tmp_path / ts.NODE / RECORD).read_text()
    assert f'"attempts": {ATTEMPTS}' in record and "RuntimeError: injected failure" in record

    log = tmp_path / "after.log"
    assert run_trainer(env, log, until=f"announced version {len(batches)}") == 0, log.read_text()
    assert f"batch node-a/{POISONED} quarantined as poison_batch" in log.read_text()

    dead: list[Record] = []

    def collect(record: Record) -> Disposition:
        dead.append(record)
        return Disposition.DONE

    loop, _, _ = make_loop(kafka_bootstrap, f"{topics.dlq}.reader", [topics.dlq], collect)
    loop.run(until=lambda: bool(dead), idle_timeout_s=20)
    loop.close()
    (letter,) = dead
    assert (letter.key, letter.headers["sapo-dlq-reason"]) == (f"node-a/{POISONED}".encode(), b"poison_batch")
    assert b"RuntimeError: injected failure" in letter.headers["sapo-dlq-detail"]
    assert wire.decode(type(batches[0]), letter.value, 1 << 20) == batches[POISONED]

    loaded = CheckpointStore(tmp_path).load_state(ts.NODE)
    assert loaded is not None
    state = torch.load(io.BytesIO(loaded[1]), weights_only=True)
    steps = {batch_id: optimizer_steps for _, batch_id, _, optimizer_steps in state["ledger"]}
    assert steps[f"node-a/{POISONED}"] == 0  # its version exists, nothing was trained for it
    assert all(steps[f"node-a/{seq}"] > 0 for seq in range(len(batches)) if seq != POISONED)
    updates = ts.policy_updates(kafka_bootstrap, topics.policy, until_version=len(batches))
    assert isinstance(updates[-1], policy_pb2.PolicyUpdate) and updates[-1].version == len(batches)


def test_a_full_checkpoint_store_stops_the_trainer_but_never_quarantines_a_batch_that_trained(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The store refuses the version after batch POISONED's step (ENOSPC) for more restarts than
    `max_step_attempts`: each run stops naming the store and the error, and once space is back the
    batch is trained, not dead-lettered as poison."""
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    tokenizer = load_bundled_tokenizer()
    batches = ts.make_batches(b.tiny(tokenizer), tokenizer, b.questions(2), count=4)
    ts.publish(kafka_bootstrap, topics.batches, batches)
    root = tmp_path / "store"
    env = ts.trainer_env(kafka_bootstrap, topic_prefix, root)
    env["SAPO_TRAINER_MAX_STEP_ATTEMPTS"] = str(ATTEMPTS)
    full = tmp_path / "full"
    full.touch()
    command = [sys.executable, "-m", "tests.integration.full_store_trainer", str(POISONED + 1), str(full)]

    for attempt in range(1, ATTEMPTS + 2):
        log = tmp_path / f"full-{attempt}.log"
        assert run_trainer(env, log, command=command) != 0, log.read_text()
        text = log.read_text()
        assert f"cannot write version {POISONED + 1} to the checkpoint store" in text, text
        assert "No space left on device" in text and "CHECKPOINT_ROOT" in text
        assert "quarantined" not in text
    full.unlink()
    log = tmp_path / "space-back.log"
    assert run_trainer(env, log, until=f"announced version {len(batches)}", command=command) == 0
    assert "quarantined" not in log.read_text(), log.read_text()

    loaded = CheckpointStore(root).load_state(ts.NODE)
    assert loaded is not None
    state = torch.load(io.BytesIO(loaded[1]), weights_only=True)
    steps = {batch_id: optimizer_steps for _, batch_id, _, optimizer_steps in state["ledger"]}
    assert all(steps[f"node-a/{seq}"] > 0 for seq in range(len(batches)))
