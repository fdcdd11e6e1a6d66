"""The trainer against the real broker: it learns from batches, announces verifiable versions, and a
SIGKILL mid-step loses nothing and trains nothing twice."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sapo.checkpoints import CheckpointStore, load_weights, read_manifest
from sapo.kafka.dlq import H_REASON
from sapo.models import load_bundled_tokenizer
from sapo.node.trainer import TrainerService
from sapo.runtime import start_runtime
from sapo.settings import ConsumerProfile, KafkaConnection
from sapo.trainer.settings import TrainerSettings
from tests.integration import trainer_support as ts
from tests.integration.kafka_helpers import read_topic
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.integration


def test_batches_through_the_broker_raise_rewarded_and_lower_penalised_completions(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    tokenizer = load_bundled_tokenizer()
    initial = b.tiny(tokenizer)
    batches = ts.make_batches(initial, tokenizer, b.questions(2), count=3)
    ts.publish(kafka_bootstrap, topics.batches, batches)
    settings = TrainerSettings(
        node_id=ts.NODE,
        model="tiny:0",
        precision="fp32",
        lr=1e-3,  # 1e-2 overshoots: tiny:0 then loses some rewarded completions along with the penalised
        checkpoint_root=tmp_path,
        keep_last=10,  # every version stays readable for the checks below
        topic_prefix=topic_prefix,
        kafka=KafkaConnection(bootstrap_servers=kafka_bootstrap),
        consumer=ConsumerProfile.local(),
        http_host="127.0.0.1",
        http_port=0,
    )
    runtime = start_runtime("trainer", settings, install_signals=False)
    try:
        service = TrainerService.from_runtime(settings, runtime)
        assert service is not None
        readiness: set[tuple[str, ...]] = set()

        def done() -> bool:
            readiness.add(tuple(service.health.failing()))
            return service.trainer.version >= len(batches)

        service.run(until=done, idle_timeout_s=30)
        assert () in readiness  # model loaded and partitions assigned while it trained
    finally:
        runtime.close()

    updates = ts.policy_updates(kafka_bootstrap, topics.policy, until_version=3)
    assert [(u.version, u.batch_id) for u in updates] == [
        (0, ""),
        (1, "node-a/0"),
        (2, "node-a/1"),
        (3, "node-a/2"),
    ]
    for update in updates:  # every announced version verifies against its digests
        manifest, directory = read_manifest(update.manifest_uri, update.manifest_sha256)
        weights = load_weights(manifest, directory)
        assert manifest.version == update.version and manifest.base_model == "tiny:0"
    trained = b.tiny(tokenizer)
    trained.load_state_dict(weights)  # the last version's
    assert updates[2].metrics.grad_norm > 0 and updates[2].metrics.completion_tokens > 0

    deltas: dict[float, list[float]] = {1.0: [], 0.0: []}
    for group in batches[0].groups[:2]:
        prompt = list(group.group.prompt_token_ids)
        ids = [list(c.token_ids) for c in group.group.completions]
        before, after = b.score(initial, prompt, ids), b.score(trained, prompt, ids)
        for reward, lp0, lp1 in zip(group.rewards, before, after, strict=True):
            deltas[reward].append(sum(lp1) - sum(lp0))
    assert min(deltas[1.0]) > 1.0, deltas  # nats gained by every rewarded completion
    assert max(deltas[0.0]) < -1.0, deltas  # and lost by every penalised one


@pytest.mark.parametrize("state_every", [1, 3])
def test_sigkill_mid_step_resumes_from_the_checkpoint_without_training_a_batch_twice(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, state_every: int
) -> None:
    """With a full state every version the restart resumes at the last one; with one every 3 it resumes
    at version 0, replays batches 0 and 1, and verifies versions 1 and 2 instead of rewriting them."""
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    tokenizer = load_bundled_tokenizer()
    batches = ts.make_batches(b.tiny(tokenizer), tokenizer, b.questions(2), count=4)
    ts.publish(kafka_bootstrap, topics.batches, batches)
    store = CheckpointStore(tmp_path)
    env = ts.trainer_env(kafka_bootstrap, topic_prefix, tmp_path)
    env["SAPO_TRAINER_STATE_EVERY"] = str(state_every)
    resume_at = 2 if state_every == 1 else 0  # the newest full state when version 2 is out
    command = [sys.executable, "-m", "services.trainer.main"]

    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    with logs[0].open("w") as out:
        first = subprocess.Popen(command, env=env, cwd=ts.ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        ts.wait_for(lambda: "announced version 2" in logs[0].read_text(), 90, "version 2")
        ts.wait_for(lambda: store.states(ts.NODE)[-1] == resume_at, 30, f"the state of version {resume_at}")
        time.sleep(0.1)  # the next batch is already fetched: version 3's step is under way
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    assert first.returncode == -signal.SIGKILL
    assert store.versions(ts.NODE)[-1] == 2, "the kill should land inside the third step"
    assert store.states(ts.NODE)[-1] == resume_at
    published = {v: store.stored(ts.NODE, v).manifest_sha256 for v in (1, 2)}

    with logs[1].open("w") as out:
        second = subprocess.Popen(command, env=env, cwd=ts.ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        ts.wait_for(lambda: len(batches) in store.versions(ts.NODE), 120, "the last version")
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    finally:
        second.kill()
    log = logs[1].read_text()
    assert second.returncode == 0, log
    assert f"resumed at version {resume_at}" in log
    if state_every == 3:  # the replayed versions matched the published ones byte for byte
        assert "version 1 verified" in log and "version 2 verified" in log, log
    assert {v: store.stored(ts.NODE, v).manifest_sha256 for v in (1, 2)} == published

    loaded = store.load_state(ts.NODE)
    assert loaded is not None
    written, data = loaded
    assert written.manifest.version == len(batches)  # SIGTERM wrote the state of the last version
    state = torch.load(io.BytesIO(data), weights_only=True)
    assert [(v, batch_id) for v, batch_id, _, _ in state["ledger"]] == [
        (seq + 1, f"node-a/{seq}") for seq in range(len(batches))
    ]
    updates = ts.policy_updates(kafka_bootstrap, topics.policy, until_version=len(batches))
    announced = {u.version: u.batch_id for u in updates}
    assert announced == {0: ""} | {seq + 1: f"node-a/{seq}" for seq in range(len(batches))}


def test_a_batch_of_an_epoch_no_lease_has_is_refused_and_later_batches_still_train(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Any client of the batch topic could send a batch of epoch 2^62: it used to be trained and to
    raise the fencing floor so high that every batch of the real sampler was refused as fenced."""
    topics = ts.node_topics(kafka_bootstrap, topic_prefix)
    tokenizer = load_bundled_tokenizer()
    batches = ts.make_batches(b.tiny(tokenizer), tokenizer, b.questions(1), count=3)
    forged = b.training_batch(1, [], node_id=ts.NODE)
    forged.epoch = 2**62
    ts.publish(kafka_bootstrap, topics.batches, [batches[0], forged, *batches[1:]])
    settings = TrainerSettings(
        node_id=ts.NODE,
        model="tiny:0",
        precision="fp32",
        checkpoint_root=tmp_path,
        topic_prefix=topic_prefix,
        kafka=KafkaConnection(bootstrap_servers=kafka_bootstrap),
        consumer=ConsumerProfile.local(),
        http_host="127.0.0.1",
        http_port=0,
        lease_read_idle_s=0.5,
    )
    runtime = start_runtime("trainer", settings, install_signals=False)
    try:
        service = TrainerService.from_runtime(settings, runtime)
        assert service is not None
        service.run(until=lambda: service.trainer.version >= len(batches), idle_timeout_s=15)
        refused = runtime.registry.get_sample_value(
            "sapo_trainer_messages_rejected_total", {"reason": "epoch_beyond_leases"}
        )
    finally:
        runtime.close()
    assert refused == 1
    updates = ts.policy_updates(kafka_bootstrap, topics.policy, until_version=len(batches))
    assert [u.batch_id for u in updates] == ["", "node-a/0", "node-a/1", "node-a/2"]
    (dead,) = read_topic(kafka_bootstrap, topics.dlq)
    assert (dead.key, dead.headers[H_REASON]) == (b"node-a/1", b"epoch_beyond_leases")
