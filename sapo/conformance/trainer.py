"""The trainer scenario: the kit plays the node's sampler (its lease and batch topic) and reads what the
trainer writes (policy announcements, checkpoints through their URLs, work items, dead letters, its
lease) and commits.

1. On start: version 0 announced, its checkpoint readable and matching its digests; round 0 planned.
   The kit takes the node's sampler lease; its batches carry that lease's epoch.
2. Batch 0 (one local and one external group): version 1 announced for it, then round 1 planned.
3. Batch 0 again, and every kind of batch the trainer must refuse on its own (undecodable, another
   node's, a group without a source, too many groups, too many completions, rewards or advantages not
   one per completion, a non-finite advantage, one from a fenced-out sampler's epoch, one more than
   `MAX_SEQUENCE_GAP` sequences ahead), then batch 2 without groups (a lock-step round without signal,
   batch 1 lost upstream: a gap it trains across), then batch 1 after all: version 2 must be batch 2's,
   the duplicate trained never, and batch 1 refused as late (`late_batch`).
4. Batch 3 of an epoch far beyond the leases topic's end, which no sampler's lease can have given: it
   must be refused (`epoch_beyond_leases`), not trained (that would fence out every later batch of
   the node's sampler).
Throughout, the trainer's committed offset must never pass a batch whose version is not announced,
unless the trainer dead-lettered it (watched while the kit waits for each version, and for a while
after). A batch the trainer dead-letters instead of training ends the wait for its version, with the
trainer's reason. A wait that times out while the trainer's consumer group has committed nothing
says whether the group had a member that finished joining it (a first join can outlast a short
`--timeout`).
"""

from __future__ import annotations

import math
import time

from sapo import storage
from sapo.checkpoints import MANIFEST, CheckpointError, read_manifest
from sapo.conformance import material
from sapo.conformance.common import (
    Position,
    Rejected,
    Sender,
    Target,
    check_dead_letters,
    check_lease,
    decoded,
    header_problem,
    unread,
)
from sapo.conformance.observe import Committed, Tail
from sapo.conformance.results import Results
from sapo.kafka import Record
from sapo.kafka.dlq import H_DETAIL, H_REASON, H_SOURCE
from sapo.node.lease import owner_id
from sapo.trainer.settings import MAX_SEQUENCE_GAP
from sapo.v1 import batch_pb2, lease_pb2, policy_pb2, work_pb2
from sapo.wire import MAX_BATCH_GROUPS, MAX_GROUP_COMPLETIONS, SCHEMA_VERSION, header_str, message_headers

SAMPLER_LEASE_TTL_S = 60.0
"""The `ttl_s` of the sampler lease the kit takes and never renews: a trainer judges a batch's epoch by
the leases topic's offsets, not by whether the lease is live, and a sampler started on the node after
the kit takes the role within a minute."""
EPOCH_BEYOND_LEASES = 1 << 40
"""The epoch of the batch no lease vouches for: an offset no conformance run's leases topic reaches."""


class _Run:
    def __init__(self, target: Target, results: Results) -> None:
        self.t = target
        self.r = results
        self.topics = target.topics
        self.out = Sender(target.kafka, target.metadata_timeout_s)
        topics = [self.topics.policy, self.topics.work, self.topics.dlq, self.topics.leases]
        self.tail = Tail(target.consumer, topics, target.metadata_timeout_s)
        self.commits = Committed(target.consumer, target.group("trainer"), target.metadata_timeout_s)
        self.questions = material.questions()
        self.sent: dict[str, Position] = {}  # batch id -> where the valid (first) copy was sent
        self.commit_problems: list[str] = []
        self.commit_seen = -1
        self.epoch = 0
        """The epoch of the kit's sampler lease, which its batches carry (`take_sampler_lease`)."""

    def close(self) -> None:
        self.tail.close()
        self.commits.close()

    def take_sampler_lease(self) -> None:
        """Write an acquisition of the node's sampler lease, as the sampler the kit plays does before
        its first batch (contract section 6): the kit's batches then carry an epoch the leases topic
        vouches for, whatever the trainer under test wrote there (`epoch_beyond_leases`)."""
        lease = lease_pb2.Lease(
            schema_version=SCHEMA_VERSION,
            node_id=self.t.node,
            role="sampler",
            owner=f"sapo-conformance/{owner_id()}",
            ttl_s=SAMPLER_LEASE_TTL_S,
        )
        lease.renewed_at.GetCurrentTime()
        value = lease.SerializeToString()
        headers = message_headers("Lease", self.t.node, value)
        _, _, offset = self.out.send(self.topics.leases, b"sampler", value, headers)
        self.epoch = offset + 1

    def updates(self) -> list[tuple[Record, policy_pb2.PolicyUpdate]]:
        found = decoded(self.tail.on(self.topics.policy), policy_pb2.PolicyUpdate)
        return [(r, u) for r, u in found if u is not None]

    def update(self, version: int, timeout_s: float) -> tuple[Record, policy_pb2.PolicyUpdate] | None:
        return self.tail.wait(
            lambda: next((p for p in self.updates() if p[1].version == version), None), timeout_s
        )

    def items(self, round_: int) -> list[tuple[Record, work_pb2.WorkItem]]:
        found = decoded(self.tail.on(self.topics.work), work_pb2.WorkItem)
        return [(r, i) for r, i in found if i is not None and i.round == round_]

    def send_batch(self, batch: batch_pb2.TrainingBatch) -> Position:
        value = batch.SerializeToString()
        headers = message_headers("TrainingBatch", batch.node_id, value)
        position = self.out.send(self.topics.batches, batch.batch_id.encode(), value, headers)
        self.sent.setdefault(batch.batch_id, position)
        return position

    def batch(self, sequence: int, groups: int) -> batch_pb2.TrainingBatch:
        sources = [batch_pb2.GROUP_SOURCE_LOCAL, batch_pb2.GROUP_SOURCE_EXTERNAL][:groups]
        node = self.t.node
        members = [
            material.batch_group(
                next(self.questions), node if s == batch_pb2.GROUP_SOURCE_LOCAL else "kit-peer-1", s, sequence
            )
            for s in sources
        ]
        return material.batch(node, sequence, members, epoch=self.epoch)

    def watch_commits(self, seconds: float) -> None:
        """Observe the trainer's committed offset for `seconds` (once at least)."""
        deadline = time.monotonic() + seconds
        while True:
            self.observe_commit()
            if time.monotonic() >= deadline:
                return

    def observe_commit(self) -> None:
        """One observation of the trainer's committed offset (a second and one fetch wait): every batch
        below it must have its version announced, or be dead-lettered (a refused batch is finished:
        its refusal is judged on its own). Both are acknowledged before the commit, so they are
        readable once the topics are read to idle. The first problem is kept."""
        tp = (self.topics.batches, 0)
        committed = self.commits.offsets([tp])[tp]
        # A fetch in flight when the announcement was written may hold it until its wait ends (the
        # embedded broker answers no sooner): read past that, or a correct commit would look early.
        self.tail.pump(1.0 + self.t.fetch_wait_max_ms / 1000)
        self.commit_seen = max(self.commit_seen, committed)
        announced = {u.batch_id for _, u in self.updates()}
        refused = {header_str(r.headers, H_SOURCE) for r in self.tail.on(self.topics.dlq)}
        early = [
            bid
            for bid, position in self.sent.items()
            if position[2] < committed and bid not in announced and _source(position) not in refused
        ]
        if early and not self.commit_problems:
            self.commit_problems.append(
                f"{self.t.group('trainer')} committed {tp[0]}/0 up to {committed} before batches {early} "
                "were in an announced version"
            )

    def trained(
        self, version: int, position: Position, timeout_s: float
    ) -> tuple[tuple[Record, policy_pb2.PolicyUpdate] | None, str]:
        """Version `version`, awaited while the trainer's commits are watched (a trainer that commits
        a batch before its version is announced does so during this wait); or None and why not, early
        when the trainer dead-letters the batch sent at `position` instead of training it."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = next((p for p in self.updates() if p[1].version == version), None)
            if got is not None:
                return got, ""
            refused = self.dead_letter_of(position)
            if refused is not None:
                reason, detail = header_str(refused.headers, H_REASON), header_str(refused.headers, H_DETAIL)
                return None, f"the trainer dead-lettered it as {reason!r}" + (f": {detail}" if detail else "")
            if time.monotonic() >= deadline:
                return None, f"none within {timeout_s:.0f} s{unread(self.t, [(self.commits, [position])])}"
            self.observe_commit()

    def dead_letter_of(self, position: Position) -> Record | None:
        source = _source(position)
        return next(
            (r for r in self.tail.on(self.topics.dlq) if header_str(r.headers, H_SOURCE) == source), None
        )


def _source(position: Position) -> str:
    """A dead letter's `sapo-dlq-source` for the message sent at `position`."""
    return "/".join(map(str, position))


def run(target: Target, results: Results) -> None:
    run = _Run(target, results)
    try:
        run.take_sampler_lease()
        _scenario(run)
    finally:
        run.close()


def _scenario(run: _Run) -> None:
    t, topics = run.t, run.topics
    got = run.update(0, t.timeout_s)
    if not run.r.add(
        "announces its policy on start",
        "§9.3",
        got is not None,
        f"version 0 on {topics.policy}"
        if got
        else f"no version 0 on {topics.policy} within {t.timeout_s:.0f} s",
    ):
        return
    assert got is not None
    _check_update(run, *got, expect_batch="")
    _check_plan(run, 0)

    batch0 = run.batch(0, groups=2)
    got1, why = run.trained(1, run.send_batch(batch0), t.timeout_s)
    if not run.r.add(
        "trains a batch into the next version",
        "§9.2",
        got1 is not None,
        "version 1 announced after batch 0" if got1 else f"no version 1 for batch {batch0.batch_id}: {why}",
    ):
        return
    assert got1 is not None
    _check_update(run, *got1, expect_batch=batch0.batch_id)
    _check_plan(run, 1)
    run.watch_commits(t.quiet_s / 2)

    dead = _send_refused(run, batch0)
    batch2 = run.batch(2, groups=0)
    position2 = run.send_batch(batch2)
    dead.append(_send_late(run))
    got2, why = run.trained(2, position2, t.timeout_s)
    run.r.add(
        "keeps going after bad input",
        "§5.5",
        got2 is not None,
        "version 2 announced after the refused batches"
        if got2
        else f"no version 2 for batch {batch2.batch_id}: {why}",
    )
    if got2 is None:
        run.r.skip("refuses an epoch no lease gave", "§6", "no version 2 to follow")
    else:
        _check_epoch_beyond_leases(run)
    run.watch_commits(t.quiet_s)
    _check_versions(run, {1: batch0.batch_id, 2: batch2.batch_id})
    check_dead_letters(run.r, run.tail, topics, dead, t.timeout_s)
    updates = {u.version: u.epoch for _, u in run.updates()}
    items = {f"round {i.round} work item": i.epoch for _, i in run.items(0)[:1] + run.items(1)[:1]}
    check_lease(
        run.r, run.tail, topics, "trainer", {f"version {v}": e for v, e in sorted(updates.items())} | items
    )
    _check_commits(run, batch2.batch_id)


def _check_update(run: _Run, record: Record, update: policy_pb2.PolicyUpdate, *, expect_batch: str) -> None:
    node = run.t.node
    problems = []
    if record.key != node.encode():
        problems.append(f"key {record.key!r}, expected the node id")
    problem = header_problem(record, "PolicyUpdate", node)
    if problem:
        problems.append(problem)
    if update.node_id != node or update.batch_id != expect_batch:
        problems.append(f"node {update.node_id!r}, batch id {update.batch_id!r} (expected {expect_batch!r})")
    if expect_batch and not update.HasField("metrics"):
        problems.append("no step metrics")
    run.r.add(
        f"version {update.version} announcement",
        "§9.3",
        not problems,
        "; ".join(problems) or f"key, headers, node, batch id{', step metrics' if expect_batch else ''}",
    )
    run.r.add(f"version {update.version} is durable before it is announced", "§9.3", *_durable(update))


def _durable(update: policy_pb2.PolicyUpdate) -> tuple[bool, str]:
    """Whether the announced checkpoint can be read and matches its digests."""
    try:
        manifest, directory = read_manifest(update.manifest_uri, update.manifest_sha256)
        if manifest.node_id != update.node_id or manifest.version != update.version:
            return False, f"{update.manifest_uri} describes {manifest.node_id} v{manifest.version}"
        for entry in manifest.weights:
            storage.read_verified(directory, entry, manifest.digest, listed_in=MANIFEST)
    except (CheckpointError, OSError, ValueError) as exc:
        return False, f"the announced checkpoint {update.manifest_uri} cannot be read: {exc}"
    return True, f"manifest and {len(manifest.weights)} weight file(s) match their digests"


def _check_plan(run: _Run, round_: int) -> None:
    t = run.t
    q = t.questions_per_round

    def complete() -> bool:
        return {i.position for _, i in run.items(round_)} >= set(range(q))

    run.tail.wait(complete, t.timeout_s)
    items = run.items(round_)
    problems = []
    if not complete():
        problems.append(
            f"positions {sorted({i.position for _, i in items})} of round {round_}, expected 0..{q - 1}"
        )
    for record, item in items:
        expected = (t.node, round_ * q + item.position, round_, True, round_)
        got = (
            item.node_id,
            item.stream_index,
            item.min_policy_version,
            item.HasField("max_policy_version"),
            item.max_policy_version,
        )
        if got != expected or record.key != f"{round_}/{item.position}".encode():
            problems.append(
                f"item {record.key!r}: (node, stream index, min, has max, max) = {got}, expected {expected}"
            )
            break
        problem = header_problem(record, "WorkItem", t.node)
        if problem:
            problems.append(problem)
            break
    run.r.add(
        f"plans round {round_} once version {round_} exists",
        "§9.4",
        not problems,
        "; ".join(problems) or f"{q} items, lock-step bounds [{round_}, {round_}], stream positions",
    )


def _send_refused(run: _Run, batch0: batch_pb2.TrainingBatch) -> list[Rejected]:
    run.send_batch(batch0)  # the same batch again: at-least-once delivery
    dead = [_send_rejected(run, b"kit-junk", b"\x0a\xff\xff\xff", "undecodable", "undecodable batch")]

    def send(batch: batch_pb2.TrainingBatch, reason: str, what: str) -> None:
        dead.append(_send_rejected(run, batch.batch_id.encode(), batch.SerializeToString(), reason, what))

    send(material.batch("kit-other", 1, [], epoch=run.epoch), "wrong_node", "batch for another node")
    sourceless = run.batch(1, groups=1)
    sourceless.groups[0].source = batch_pb2.GROUP_SOURCE_UNSPECIFIED
    send(sourceless, "missing_source", "batch with a group of no source")
    crowded = run.batch(1, groups=1)
    crowded.groups.extend([crowded.groups[0]] * MAX_BATCH_GROUPS)
    send(crowded, "too_many_groups", f"batch of more than {MAX_BATCH_GROUPS} groups")
    wide = run.batch(1, groups=1)
    group = wide.groups[0]
    while len(group.group.completions) <= MAX_GROUP_COMPLETIONS:
        i = len(group.group.completions) % 4
        group.group.completions.add().CopyFrom(group.group.completions[i])
        group.rewards.append(group.rewards[i])
        group.advantages.append(group.advantages[i])
    send(wide, "too_many_completions", f"batch with a group of more than {MAX_GROUP_COMPLETIONS} completions")
    short = run.batch(1, groups=1)
    del short.groups[0].rewards[-1]
    send(short, "reward_length_mismatch", "batch with a reward missing for a completion")
    unbounded = run.batch(1, groups=1)
    unbounded.groups[0].advantages[0] = math.nan
    send(unbounded, "nonfinite_advantage", "batch with a NaN advantage")
    fenced = run.batch(1, groups=1)
    fenced.epoch = run.epoch - 1
    send(fenced, "fenced_batch", "batch of a fenced-out sampler")
    wild = run.batch(2 + MAX_SEQUENCE_GAP, groups=0)  # batch 0 was trained: sequence 1 is next
    send(wild, "sequence_gap_too_large", f"batch more than {MAX_SEQUENCE_GAP} sequences ahead")
    return dead


def _send_late(run: _Run) -> Rejected:
    """Batch 1, sent after batch 2 (whose version it would have had): the trainer must refuse it."""
    late = run.batch(1, groups=0)
    value = late.SerializeToString()
    return _send_rejected(run, late.batch_id.encode(), value, "late_batch", "batch 1, sent after batch 2")


def _send_rejected(run: _Run, key: bytes, value: bytes, reason: str, what: str) -> Rejected:
    """Send to the batch topic what the trainer must dead-letter as `reason`."""
    headers = message_headers("TrainingBatch", run.t.node, value)
    return Rejected(run.out.send(run.topics.batches, key, value, headers), key, value, reason, what)


def _check_epoch_beyond_leases(run: _Run) -> None:
    """Batch 3 of an epoch past the leases topic's end: dead-lettered as `epoch_beyond_leases` (the
    trainer reads that topic until it is idle first), not trained."""
    beyond = run.batch(3, groups=0)
    beyond.epoch = EPOCH_BEYOND_LEASES
    position = run.send_batch(beyond)

    def trained() -> policy_pb2.PolicyUpdate | None:
        return next((u for _, u in run.updates() if u.batch_id == beyond.batch_id), None)

    run.tail.wait(lambda: run.dead_letter_of(position) or trained(), run.t.timeout_s)
    refused, update = run.dead_letter_of(position), trained()
    reason = header_str(refused.headers, H_REASON) if refused is not None else None
    if update is not None:
        what = f"trained into version {update.version}"
    elif refused is not None:
        what = f"dead-lettered as {reason!r}"
    else:
        what = f"neither trained nor dead-lettered within {run.t.timeout_s:.0f} s"
    run.r.add(
        "refuses an epoch no lease gave",
        "§6",
        reason == "epoch_beyond_leases" and update is None,
        f"batch {beyond.batch_id} of sampler epoch {beyond.epoch}, beyond the end of {run.topics.leases}: "
        + what,
    )


def _check_versions(run: _Run, expected: dict[int, str]) -> None:
    by_version: dict[int, set[str]] = {}
    for _, update in run.updates():
        by_version.setdefault(update.version, set()).add(update.batch_id)
    trained = [bid for v, ids in sorted(by_version.items()) if v > 0 for bid in ids]
    problems = []
    for bid in sorted({bid for bid in trained if trained.count(bid) > 1}):
        versions = ", ".join(str(v) for v, ids in sorted(by_version.items()) if v > 0 and bid in ids)
        problems.append(f"batch {bid} trained into versions {versions}")
    for version, ids in sorted(by_version.items()):
        if version in expected and ids != {expected[version]}:
            problems.append(f"version {version} trained {', '.join(sorted(ids))}, not {expected[version]}")
    run.r.add(
        "never trains a batch twice",
        "§9.2",
        not problems,
        "; ".join(problems)
        or "the re-delivered batch 0 was skipped; version 2 is batch 2 (no groups, after a gap)",
    )


def _check_commits(run: _Run, last_batch: str) -> None:
    run.r.add(
        "commits only durable work",
        "§5.4",
        not run.commit_problems,
        "; ".join(run.commit_problems)
        or f"committed offset never passed an unannounced batch (last seen {run.commit_seen})",
    )
    position = run.sent[last_batch]
    tp = position[:2]
    done = run.tail.wait(lambda: run.commits.offsets([tp])[tp] > position[2] or None, run.t.timeout_s)
    run.r.add(
        "commits once work is durable",
        "§5.4",
        bool(done),
        f"committed past batch {last_batch}"
        if done
        else f"{run.t.group('trainer')} did not commit past {last_batch} (offset {position[2]}) within "
        f"{run.t.timeout_s:.0f} s of its version",
    )
