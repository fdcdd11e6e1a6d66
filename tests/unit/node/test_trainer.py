"""The trainer service over the in-memory transport: announce, checkpoint-then-commit, resume, bad input."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry
from s3fs.errors import translate_boto_error
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.checkpoints import MANIFEST, CheckpointStore, load_weights, read_manifest
from sapo.kafka import DeadLetters, TransportMetrics
from sapo.kafka.memory import MemoryBus, MemoryConsumerClient, MemoryPublisher
from sapo.lifecycle import StopFlag
from sapo.node.build import build_trainer
from sapo.node.lease import Lease, LeaseMetrics
from sapo.node.metrics import TrainerMetrics
from sapo.node.trainer import TrainerService, offsets_beyond_end
from sapo.ops import Health
from sapo.settings import ConfigError
from sapo.topics import TopicNames
from sapo.trainer.settings import TrainerSettings
from sapo.v1 import batch_pb2, policy_pb2, question_pb2
from sapo.wire import message_headers
from tests.unit.trainer import builders as b

pytestmark = pytest.mark.unit
TOPICS = TopicNames.for_node("node-a")


def _service(
    bus: MemoryBus,
    root: Path | str,
    *,
    lease: Lease | None = None,
    stop: StopFlag | None = None,
    **overrides: Any,
) -> tuple[TrainerService, CollectorRegistry]:
    settings = TrainerSettings(
        node_id="node-a", model="tiny:0", precision="fp32", checkpoint_root=root, lr=1e-2, **overrides
    )
    registry = CollectorRegistry()
    transport = TransportMetrics(registry, "trainer")
    service = TrainerService(
        settings,
        build_trainer(settings),
        client=MemoryConsumerClient(bus, "node-a.trainer"),
        publisher=MemoryPublisher(bus),
        topics=TOPICS,
        health=Health(),
        metrics=TrainerMetrics(registry),
        transport=transport,
        stop=stop or StopFlag(),
        dead_letters=DeadLetters(MemoryPublisher(bus), TOPICS.dlq, "trainer", transport),
        lease=lease,
        poll_timeout_s=0.0,  # the memory client never blocks
    )
    return service, registry


def _publish(bus: MemoryBus, batch: batch_pb2.TrainingBatch) -> None:
    bus.append(TOPICS.batches, batch.batch_id.encode(), batch.SerializeToString(), [])


def _updates(bus: MemoryBus) -> list[policy_pb2.PolicyUpdate]:
    return [policy_pb2.PolicyUpdate.FromString(v) for v in bus.values(TOPICS.policy)]


def _batch(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, q: question_pb2.Question, seq: int
) -> batch_pb2.TrainingBatch:
    group = b.local_group(model, tokenizer, q, list(b.answers(q)), policy_version=seq)
    return b.training_batch(seq, [b.batch_group(group, [1.0, 0.0])])


def test_announces_version_zero_then_every_version_with_verifiable_manifests(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    bus = MemoryBus()
    _publish(bus, _batch(model, tokenizer, questions[0], 0))
    _publish(bus, b.training_batch(1, []))  # a lock-step round without signal
    service, registry = _service(bus, tmp_path)
    service.start()
    assert service.health.failing() == ["partitions_assigned"]

    service.run(idle_timeout_s=0.0)

    updates = _updates(bus)
    assert [(u.version, u.batch_id) for u in updates] == [(0, ""), (1, "node-a/0"), (2, "node-a/1")]
    assert updates[1].metrics.completion_tokens > 0 and updates[1].metrics.reward_mean == 0.5
    for update in updates:
        manifest, directory = read_manifest(update.manifest_uri, update.manifest_sha256)
        assert manifest.version == update.version and manifest.base_model == "tiny:0"
        assert load_weights(manifest, directory)  # every shard matches its digest
    assert bus.committed[("node-a.trainer", (TOPICS.batches, 0))] == 2
    sample = registry.get_sample_value
    assert sample("sapo_trainer_batches_total", {"outcome": "trained"}) == 1
    assert sample("sapo_trainer_batches_total", {"outcome": "empty"}) == 1
    assert sample("sapo_trainer_steps_total") == 1
    assert sample("sapo_trainer_policy_version") == 2
    assert sample("sapo_trainer_sequences_total", {"mode": "behaviour"}) == 2  # sampled by v0 itself
    assert sample("sapo_trainer_checkpoint_seconds_count") == 2


def test_restart_resumes_at_the_checkpoint_offsets_and_skips_replayed_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    bus = MemoryBus()
    first_batch = _batch(model, tokenizer, questions[0], 0)
    _publish(bus, first_batch)
    service, _ = _service(bus, tmp_path)
    service.start()
    service.run(idle_timeout_s=0.0)
    trained = {k: v.clone() for k, v in service.trainer.model.state_dict().items()}

    bus.committed.clear()  # the commit was lost: the checkpoint must still win
    _publish(bus, first_batch)  # and the sampler re-sent the batch
    _publish(bus, _batch(model, tokenizer, questions[1], 1))
    restarted, registry = _service(bus, tmp_path)
    restarted.start()
    assert restarted.trainer.version == 1
    assert all(v.equal(trained[k]) for k, v in restarted.trainer.model.state_dict().items())
    restarted.run(idle_timeout_s=0.0)

    assert [e.batch_id for e in restarted.trainer.state.ledger] == ["node-a/0", "node-a/1"]
    assert registry.get_sample_value("sapo_trainer_batches_total", {"outcome": "duplicate"}) == 1
    assert registry.get_sample_value("sapo_trainer_batches_total", {"outcome": "trained"}) == 1
    assert [u.version for u in _updates(bus)] == [0, 1, 1, 2]  # a restart re-announces what it has
    assert registry.get_sample_value("sapo_trainer_input_offsets_reset_total") == 0  # the same topic


def test_a_batch_topic_re_created_under_kept_checkpoints_is_read_from_its_beginning(tmp_path: Path) -> None:
    """A reinstall: the checkpoints stayed, the topics are new. The stored offset (3) lies beyond the
    new topic's end: the trainer reads it from the start, so the sampler's next batch (sequence 3, at
    offset 0) is trained; the memory client, like the embedded broker, would wait forever at 3."""
    bus = MemoryBus()
    for seq in range(3):
        _publish(bus, b.training_batch(seq, []))
    service, _ = _service(bus, tmp_path)
    service.start()
    service.run(idle_timeout_s=0.0)  # stops with a full state at version 3, offset 3
    updates = _updates(bus)
    assert [(u.version, u.sequence if u.HasField("sequence") else None) for u in updates] == [
        (0, None),
        (1, 0),
        (2, 1),
        (3, 2),
    ]

    fresh = MemoryBus()  # new topics, no committed offsets
    restarted, registry = _service(fresh, tmp_path)
    restarted.start()
    assert restarted.trainer.state.offsets == {(TOPICS.batches, 0): 0}
    assert registry.get_sample_value("sapo_trainer_input_offsets_reset_total") == 1
    ((announced),) = [(u.version, u.sequence) for u in _updates(fresh)]
    assert announced == (3, 2)  # the sampler numbers its next batch 3 (sapo.node.trained)
    _publish(fresh, b.training_batch(3, []))
    restarted.run(idle_timeout_s=0.0)
    assert restarted.trainer.version == 4
    assert registry.get_sample_value("sapo_trainer_batches_total", {"outcome": "duplicate"}) == 0
    assert fresh.committed[("node-a.trainer", (TOPICS.batches, 0))] == 1


def test_only_offsets_beyond_a_partitions_end_restart_at_its_first_offset() -> None:
    stored = {("b", 0): 5, ("b", 1): 5, ("b", 2): 5, ("gone", 0): 1, ("gone", 1): 0}
    bounds = {("b", 0): (0, 5), ("b", 1): (2, 4), ("b", 2): (0, 9)}
    assert offsets_beyond_end(stored, bounds) == {("b", 1): 2, ("gone", 0): 0}


def test_weights_are_published_every_k_and_offsets_committed_only_with_the_full_state(tmp_path: Path) -> None:
    bus = MemoryBus()
    for seq in range(5):
        _publish(bus, b.training_batch(seq, []))
    service, registry = _service(bus, tmp_path, checkpoint_every=2, state_every=4)
    service.start()
    committed = ("node-a.trainer", (TOPICS.batches, 0))
    service.loop.open()
    service.loop.step(0)
    assert bus.committed.get(committed) is None and [u.version for u in _updates(bus)] == [0]
    service.loop.step(0)  # version 2: published and announced, but no state yet, so no commit
    assert bus.committed.get(committed) is None and [u.version for u in _updates(bus)] == [0, 2]
    service.loop.step(0)
    service.loop.step(0)  # version 4: published, and the state is due
    assert bus.committed[committed] == 4 and [u.version for u in _updates(bus)] == [0, 2, 4]
    service.loop.step(0)  # version 5 is held ...
    service.loop.step(0)  # ... and published once the loop goes idle, still without a commit
    assert bus.committed[committed] == 4 and [u.version for u in _updates(bus)] == [0, 2, 4, 5]
    service.run(idle_timeout_s=0.0)  # stopping writes the state: now the offset is committed
    assert bus.committed[committed] == 5
    store = service.trainer.store
    assert store.versions("node-a") == [2, 4, 5] and store.states("node-a") == [4, 5]
    assert registry.get_sample_value("sapo_trainer_state_seconds_count") == 2  # version 0's came first


def _four_steps_then_killed(bus: MemoryBus, tmp_path: Path) -> CheckpointStore:
    """A trainer (a full state every 3 versions) steps the 4 batches on `bus` and is dropped as a
    SIGKILL drops it: version 4 published, its state never written, offset 3 committed."""
    first, _ = _service(bus, tmp_path, state_every=3, keep_last=10)
    first.start()
    first.loop.open()
    for _ in range(4):
        first.loop.step(0)
    store = first.trainer.store
    assert store.versions("node-a") == [0, 1, 2, 3, 4] and store.states("node-a") == [0, 3]
    return store


def test_a_crash_replays_from_the_full_state_and_verifies_the_versions_it_republishes(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    bus = MemoryBus()
    for seq in range(4):
        _publish(bus, _batch(model, tokenizer, questions[seq % 2], seq))
    store = _four_steps_then_killed(bus, tmp_path)
    published = store.stored("node-a", 4)

    restarted, registry = _service(bus, tmp_path, state_every=3, keep_last=10)
    restarted.start()
    assert restarted.trainer.version == 3
    restarted.run(idle_timeout_s=0.0)

    assert [e.batch_id for e in restarted.trainer.state.ledger] == [f"node-a/{s}" for s in range(4)]
    assert registry.get_sample_value("sapo_trainer_versions_published_total", {"outcome": "verified"}) == 1
    assert registry.get_sample_value("sapo_trainer_versions_published_total", {"outcome": "written"}) == 0
    assert store.latest("node-a") == published  # the same manifest, not rewritten
    stored = load_weights(published.manifest, published.directory)
    assert all(torch.equal(stored[k], v) for k, v in restarted.trainer.model.state_dict().items())
    # The restart announced the newest stored version (4) at once, and nothing older after it.
    assert [u.version for u in _updates(bus)] == [0, 1, 2, 3, 4, 4]
    assert store.states("node-a") == [0, 3, 4]


def test_a_version_torn_by_a_host_crash_is_rewritten_not_verified_and_resumed_from(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    """A policy version's files are not fsynced when it is published: a host crash can leave one whose
    manifest survived and whose weights did not. The replay must not take it as verified (its digests
    are those of the weights in memory) and write a full state beside it, fsyncing the torn file: every
    later restart would fail on it, with the older states pruned."""
    bus = MemoryBus()
    for seq in range(4):
        _publish(bus, _batch(model, tokenizer, questions[seq % 2], seq))
    store = _four_steps_then_killed(bus, tmp_path)
    torn = store.stored("node-a", 4)
    shard = Path((torn.directory / torn.manifest.weights[0].name).path)
    shard.write_bytes(b"\0" * shard.stat().st_size)  # the host crashed before its pages were written

    restarted, registry = _service(bus, tmp_path, state_every=3, keep_last=10)
    restarted.start()
    restarted.run(idle_timeout_s=0.0)  # replays version 4 and writes its full state on stopping
    assert registry.get_sample_value("sapo_trainer_versions_published_total", {"outcome": "verified"}) == 0
    assert registry.get_sample_value("sapo_trainer_versions_published_total", {"outcome": "written"}) == 1
    assert store.states("node-a") == [0, 3, 4]
    rewritten = store.stored("node-a", 4)
    assert load_weights(rewritten.manifest, rewritten.directory)  # every shard matches its digest
    # Generators hold the start's announcement of version 4, whose manifest the rewrite replaced.
    announced = [(u.version, u.manifest_sha256) for u in _updates(bus)][-2:]
    assert announced == [(4, torn.manifest_sha256), (4, rewritten.manifest_sha256)]

    again, _ = _service(bus, tmp_path, state_every=3, keep_last=10)
    again.start()  # resumes from the state beside the rewritten version
    assert again.trainer.version == 4


def test_a_restart_after_a_host_crash_tore_the_newest_manifest_announces_the_newest_readable_one(
    tmp_path: Path,
) -> None:
    """The newest version's (unsynced) manifest is garbage after a host crash: the restart announces the
    newest version that reads, instead of failing on the torn one at every start, and the replay writes
    the torn one again and announces it."""
    bus = MemoryBus()
    for seq in range(4):
        _publish(bus, b.training_batch(seq, []))
    store = _four_steps_then_killed(bus, tmp_path)
    Path((store.version_dir("node-a", 4) / MANIFEST).path).write_bytes(b"\0" * 100)

    restarted, _ = _service(bus, tmp_path, state_every=3, keep_last=10)
    restarted.start()
    assert [u.version for u in _updates(bus)][-1] == 3
    restarted.run(idle_timeout_s=0.0)
    rewritten = store.stored("node-a", 4)
    last = _updates(bus)[-1]
    assert (last.version, last.manifest_sha256) == (4, rewritten.manifest_sha256)
    assert store.states("node-a") == [0, 3, 4]


def test_bad_batches_are_dead_lettered_and_training_goes_on(tmp_path: Path) -> None:
    bus = MemoryBus()
    bus.append(TOPICS.batches, b"junk", b"\xff\xff", [])
    foreign = b.training_batch(0, [], node_id="node-b")
    bus.append(TOPICS.batches, b"x", foreign.SerializeToString(), [])
    _publish(bus, b.training_batch(0, []))
    service, registry = _service(bus, tmp_path)
    service.start()
    service.run(idle_timeout_s=0.0)
    reasons = [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]]
    assert reasons == [b"undecodable", b"wrong_node"]
    assert service.trainer.version == 1
    assert registry.get_sample_value("sapo_trainer_messages_rejected_total", {"reason": "wrong_node"}) == 1


def test_a_batch_is_judged_by_the_node_its_body_names_not_its_node_header(tmp_path: Path) -> None:
    """The header routes, the body is what the trainer trusts (docs/contract.md section 3.1): a batch
    of this node is trained whatever its `sapo-node-id` says, another node's is refused whatever it
    says."""
    bus = MemoryBus()
    ours, foreign = b.training_batch(0, []), b.training_batch(1, [], node_id="node-b")
    bus.append(
        TOPICS.batches, b"0", ours.SerializeToString(), message_headers("TrainingBatch", "node-b", b"")
    )
    bus.append(
        TOPICS.batches, b"1", foreign.SerializeToString(), message_headers("TrainingBatch", "node-a", b"")
    )
    service, _ = _service(bus, tmp_path)
    service.start()
    service.run(idle_timeout_s=0.0)
    assert [(e.version, e.batch_id) for e in service.trainer.state.ledger] == [(1, "node-a/0")]
    assert [r.headers["sapo-dlq-reason"] for r in bus.topics[TOPICS.dlq]] == [b"wrong_node"]


def test_a_batch_that_arrives_after_a_later_one_is_refused_as_late_not_called_a_duplicate(
    tmp_path: Path,
) -> None:
    """Versions follow sequence: once sequence 2 took version 1 (sequences 0 and 1 lost upstream, a
    gap), sequence 0 arriving after all is dead-lettered `late_batch`, never trained out of order nor
    counted as the duplicate it is not; sequence 2 re-delivered is the duplicate."""
    bus = MemoryBus()
    for seq in (2, 0, 2, 3):
        _publish(bus, b.training_batch(seq, []))
    service, registry = _service(bus, tmp_path)
    service.start()
    service.run(idle_timeout_s=0.0)

    assert [(e.version, e.sequence) for e in service.trainer.state.ledger] == [(1, 2), (2, 3)]
    [late] = bus.topics[TOPICS.dlq]
    assert late.headers["sapo-dlq-reason"] == b"late_batch"
    assert b"sequence 0" in late.headers["sapo-dlq-detail"]
    sample = registry.get_sample_value
    assert sample("sapo_trainer_messages_rejected_total", {"reason": "late_batch"}) == 1
    assert sample("sapo_trainer_batches_total", {"outcome": "duplicate"}) == 1
    assert sample("sapo_trainer_sequence_gaps_total") == 2
    assert bus.committed[("node-a.trainer", (TOPICS.batches, 0))] == 4


def test_a_batch_with_a_wild_sequence_is_refused_so_the_node_keeps_training(tmp_path: Path) -> None:
    """Trained, sequence 2**63 - 1 would make every later batch of the sampler late: the node wedged."""
    bus = MemoryBus()
    for seq in (0, 2**63 - 1, 1, 1 + 10_000):
        _publish(bus, b.training_batch(seq, []))
    service, registry = _service(bus, tmp_path)
    service.start()
    service.run(idle_timeout_s=0.0)

    assert [(e.version, e.sequence) for e in service.trainer.state.ledger] == [(1, 0), (2, 1), (3, 10_001)]
    [wild] = bus.topics[TOPICS.dlq]
    assert wild.headers["sapo-dlq-reason"] == b"sequence_gap_too_large"
    assert b"SAPO_TRAINER_MAX_SEQUENCE_GAP=10000" in wild.headers["sapo-dlq-detail"]
    assert registry.get_sample_value("sapo_trainer_sequence_gaps_total") == 9_999  # the largest gap allowed


def test_kills_after_a_batch_trained_never_quarantine_it(tmp_path: Path) -> None:
    """The trainer is killed (SIGKILL, a node lost) after batch 1 trained, before a full state covers
    it, more times than `max_step_attempts`: each restart replays batch 1 and trains it again. Its
    steps succeeded every time, so it is no poison batch: it is trained, not dead-lettered."""
    bus = MemoryBus()
    for seq in range(2):
        _publish(bus, b.training_batch(seq, []))
    for _ in range(3):
        killed, _ = _service(bus, tmp_path, max_step_attempts=2)
        killed.start()
        killed.loop.open()
        killed.loop.step(0)
        killed.loop.step(0)  # versions 1 and 2 published; the full state is still version 0's
        assert killed.trainer.version == 2 and killed.trainer.store.states("node-a") == [0]
        del killed

    restarted, registry = _service(bus, tmp_path, max_step_attempts=2)
    restarted.start()
    restarted.run(idle_timeout_s=0.0)
    assert registry.get_sample_value("sapo_trainer_batches_total", {"outcome": "quarantined"}) == 0
    assert bus.topics.get(TOPICS.dlq, []) == []
    assert [e.batch_id for e in restarted.trainer.state.ledger] == ["node-a/0", "node-a/1"]


def test_a_quarantined_batch_is_counted_once_and_times_no_step() -> None:
    from sapo.trainer import BuiltBatch, StepReport

    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry)
    skipped = StepReport(
        version=3,
        batch_id="b",
        sequence=2,
        gap=0,
        built=BuiltBatch(),
        stats=None,
        lr=0.0,
        seconds=0.0,
        quarantined=True,
    )
    metrics.observe(skipped)

    def batches(outcome: str) -> float | None:
        return registry.get_sample_value("sapo_trainer_batches_total", {"outcome": outcome})

    assert (batches("quarantined"), batches("empty"), batches("trained")) == (1, 0, 0)
    assert registry.get_sample_value("sapo_trainer_step_seconds_count") == 0
    assert registry.get_sample_value("sapo_trainer_policy_version") == 3


@pytest.mark.parametrize(
    ("root", "said"),
    [
        ("nosuch://bucket/ckpt", "Protocol not known: nosuch"),
        ("/proc/sapo-ckpt", "cannot create the directory /proc/sapo-ckpt"),
        ("{file}", "cannot create the directory"),
    ],
)
def test_a_checkpoint_root_that_cannot_be_used_fails_prepare(tmp_path: Path, root: str, said: str) -> None:
    """The store was first touched after the lease, where these ended the trainer in a traceback."""
    (tmp_path / "file").write_text("")
    settings = TrainerSettings(
        node_id="n", model="tiny:1", checkpoint_root=root.format(file=tmp_path / "file")
    )
    with pytest.raises(ConfigError) as error:
        TrainerService.prepare(settings)
    assert str(error.value).startswith("SAPO_TRAINER_CHECKPOINT_ROOT=") and said in str(error.value)
    TrainerService.prepare(
        TrainerSettings(node_id="n", model="tiny:1", checkpoint_root=str(tmp_path / "a" / "b"))
    )
    assert (tmp_path / "a" / "b").is_dir()


def test_a_store_that_refuses_the_trainer_fails_start_saying_what_to_set(no_s3_credentials: str) -> None:
    """No credentials in the environment (none mounted, no role): once a botocore traceback."""
    service, _ = _service(MemoryBus(), no_s3_credentials)
    with pytest.raises(ConfigError) as error:
        service.start()
    said = str(error.value)
    assert said.startswith(f"SAPO_TRAINER_CHECKPOINT_ROOT='{no_s3_credentials}'")
    assert "AWS_ACCESS_KEY_ID" in said


def _failing_start(
    service: TrainerService, error: Exception, monkeypatch: pytest.MonkeyPatch
) -> BaseException:
    def initialize() -> None:
        raise error

    monkeypatch.setattr(service.trainer, "initialize", initialize)
    with pytest.raises(BaseException) as raised:  # ConfigError is a SystemExit
        service.start()
    return raised.value


def test_only_the_stores_own_refusal_gets_the_credentials_hint(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3fs turns a 403 into a PermissionError caused by botocore's ClientError: that one is the store's.
    A PermissionError of a local file under a remote root (a cache directory) used to be reported as
    the store refusing access, with advice about AWS credentials."""
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject")
    refused = _failing_start(_service(MemoryBus(), s3_url)[0], translate_boto_error(denied), monkeypatch)
    assert isinstance(refused, ConfigError) and "the store refused access (Access Denied)" in str(refused)
    assert "AWS_ACCESS_KEY_ID" in str(refused)
    local = PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/var/cache/sapo/weights")
    assert _failing_start(_service(MemoryBus(), s3_url)[0], local, monkeypatch) is local


def _lease(bus: MemoryBus, role: str, stop: StopFlag) -> Lease:
    registry = CollectorRegistry()
    return Lease(
        MemoryConsumerClient(bus, f"node-a.{role}-lease"),
        MemoryPublisher(bus),
        topic=TOPICS.leases,
        node_id="node-a",
        role=role,
        ttl_s=30.0,
        idle_s=0.0,
        metrics=LeaseMetrics(registry, role),
        transport=TransportMetrics(registry, role),
        health=Health(),
        stop=stop,
    )


def test_a_stop_while_reading_for_a_batchs_acquisition_leaves_the_batch_to_the_next_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: list[question_pb2.Question],
    tmp_path: Path,
) -> None:
    """A batch of a sampler epoch whose acquisition the trainer has not read yet is read for; a stop
    cuts that read short, which says nothing about the batch. It used to be refused there as
    `epoch_beyond_leases`: dead-lettered and committed, a real sampler's batch never trained."""
    bus, stop = MemoryBus(), StopFlag()
    trainer_lease = _lease(bus, "trainer", stop)
    assert trainer_lease.acquire()
    service, registry = _service(bus, tmp_path, lease=trainer_lease, stop=stop)
    service.start()
    sampler_lease = _lease(bus, "sampler", StopFlag())
    assert sampler_lease.acquire() and sampler_lease.epoch > trainer_lease.end  # not read by the trainer yet
    batch = _batch(model, tokenizer, questions[0], 0)
    batch.epoch = sampler_lease.epoch
    _publish(bus, batch)
    stop.set()  # SIGTERM: the loop finishes the record in hand
    service.loop.open()
    while service.loop.step(0.0) or not service.loop.assigned:
        pass
    service.close()

    assert bus.values(TOPICS.dlq) == []
    assert (
        registry.get_sample_value("sapo_trainer_messages_rejected_total", {"reason": "epoch_beyond_leases"})
        is None
    )
    assert bus.committed.get(("node-a.trainer", (TOPICS.batches, 0)), 0) == 0

    restarted, _ = _service(bus, tmp_path, lease=_lease(bus, "trainer", StopFlag()))
    assert restarted.lease is not None and restarted.lease.acquire()
    restarted.start()
    restarted.run(idle_timeout_s=0.0)
    assert [u.batch_id for u in _updates(bus)][-1] == "node-a/0"
