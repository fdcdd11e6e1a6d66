"""The sampler scenario: the kit plays the node's generator (its rollout topic) and two peers (the
swarm topic), and reads what the sampler writes (batches, dead letters, its lease) and commits.

Rounds, with the conformance profile (docs/contract.md section 11: lock-step, I = 2, J = 2, two
expected peers, at most one group per peer, three questions per round):

0. Three local groups and one group per peer, one of whose claimed rewards lie: batch 0 must hold
   2 local + 2 external groups with the receiver's own rewards.
1. Two of round 1's three local groups and one peer group: the sampler holds them pooled, so its
   committed offsets must stay below them. Then every kind of input it must refuse, and the last
   local group: batch 1, and dead letters for the malformed input.
2. A clean round: batch 2 shows that the loop went on.

No batch 0 in time while a consumer group of the sampler has committed nothing says whether that group
had a member that finished joining it (a first join can outlast a short `--timeout`).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence

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
from sapo.inspect.render import topic_label
from sapo.kafka import Record
from sapo.tasks import QuestionRecord
from sapo.tasks.records import canonical_json, sha256_hex
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import H_NODE, H_SCHEMA, H_TASK, H_TYPE, MAX_GROUP_COMPLETIONS, SCHEMA_VERSION, rollout_headers

PEERS = ("kit-peer-1", "kit-peer-2")
LOCAL_GROUPS = 2
EXTERNAL_GROUPS = 2
LOCAL = batch_pb2.GROUP_SOURCE_LOCAL
EXTERNAL = batch_pb2.GROUP_SOURCE_EXTERNAL


class _Run:
    def __init__(self, target: Target, results: Results) -> None:
        self.t = target
        self.r = results
        self.topics = target.topics
        self.out = Sender(target.kafka, target.metadata_timeout_s)
        self.tail = Tail(
            target.consumer,
            [self.topics.batches, self.topics.dlq, self.topics.leases],
            target.metadata_timeout_s,
        )
        self.local_commits = Committed(target.consumer, target.group("sampler"), target.metadata_timeout_s)
        self.swarm_commits = Committed(
            target.consumer, target.group("sampler-swarm"), target.metadata_timeout_s
        )
        self.questions = material.questions()
        self.records: dict[str, QuestionRecord] = {}
        self.positions: dict[str, Position] = {}

    def close(self) -> None:
        for closeable in (self.tail, self.local_commits, self.swarm_commits):
            closeable.close()

    # --- sending ---

    def group(
        self, node: str, correct: Sequence[bool] = (True, False, False, True), **kw: object
    ) -> rollout_pb2.RolloutGroup:
        record = next(self.questions)
        group = material.group(record, node, correct, **kw)  # type: ignore[arg-type]
        self.records[group.group_id] = record
        return group

    def send(self, topic: str, group: rollout_pb2.RolloutGroup) -> Position:
        value = group.SerializeToString()
        position = self.out.send(topic, group.group_id.encode(), value, rollout_headers(group, value))
        self.positions.setdefault(group.group_id, position)
        return position

    def local(self, group: rollout_pb2.RolloutGroup) -> Position:
        return self.send(self.topics.rollouts, group)

    def swarm(self, group: rollout_pb2.RolloutGroup) -> Position:
        return self.send(self.topics.swarm_rollouts, group)

    # --- reading ---

    def batches(self) -> list[tuple[Record, batch_pb2.TrainingBatch]]:
        found = decoded(self.tail.on(self.topics.batches), batch_pb2.TrainingBatch)
        return [(record, batch) for record, batch in found if batch is not None]

    def wait_batch(self, sequence: int, timeout_s: float) -> tuple[Record, batch_pb2.TrainingBatch] | None:
        def found() -> tuple[Record, batch_pb2.TrainingBatch] | None:
            return next((b for b in self.batches() if b[1].sequence == sequence), None)

        return self.tail.wait(found, timeout_s)


def run(target: Target, results: Results) -> None:
    run = _Run(target, results)
    try:
        _scenario(run)
    finally:
        run.close()


def _scenario(run: _Run) -> None:
    t, topics = run.t, run.topics
    q = t.questions_per_round
    # --- round 0 ---
    liar = run.group(PEERS[0], (True, False, False, False))
    for completion in liar.completions:  # the sender claims the wrong answers are right and vice versa
        completion.reward = 1.0 - completion.reward
    honest = run.group(PEERS[1], (False, True, False, True))
    run.swarm(liar)
    run.swarm(honest)
    local0 = [run.group(t.node, round_=0) for _ in range(q)]
    for group in local0:
        run.local(group)
    got = run.wait_batch(0, t.timeout_s)
    if not run.r.add(
        "emits a batch per round",
        "§8.3",
        got is not None,
        f"batch 0 on {topics.batches}"
        if got
        else f"no batch 0 on {topics.batches} within {t.timeout_s:.0f} s of a full round 0 "
        f"({q} local groups, one group from each of {len(PEERS)} peers)"
        + unread(
            t,
            [
                (run.local_commits, [run.positions[g.group_id] for g in local0]),
                (run.swarm_commits, [run.positions[g.group_id] for g in (liar, honest)]),
            ],
        ),
    ):
        return
    assert got is not None
    record0, batch0 = got
    _check_identity(run, record0, batch0, 0)
    _check_mix(run, batch0, {g.group_id for g in local0}, {liar.group_id, honest.group_id})
    _check_rewards(run, batch0, liar.group_id)
    check_lease(run.r, run.tail, topics, "sampler", {"batch 0": batch0.epoch})
    _check_offsets(run, batch0)

    # --- round 1: pooled input must not be committed ---
    local1 = [run.group(t.node, round_=1) for _ in range(q)]
    held_local = [run.local(g) for g in local1[:-1]]
    pooled_peer = run.group(PEERS[0], round_=1)
    held_swarm = run.swarm(pooled_peer)
    _check_commits_held(run, held_local[0], held_swarm)

    # --- round 1: everything the sampler must refuse ---
    refused, dead = _send_refused(run, batch0)
    late_peer = run.group(PEERS[1], round_=1)
    run.swarm(late_peer)
    run.local(local1[-1])
    got1 = run.wait_batch(1, t.timeout_s)
    if not run.r.add(
        "keeps going after bad input",
        "§5.5",
        got1 is not None,
        "batch 1 emitted after the refused input"
        if got1
        else f"no batch 1 within {t.timeout_s:.0f} s of round 1 completing",
    ):
        return
    check_dead_letters(run.r, run.tail, topics, dead, t.timeout_s)
    _check_commits_done(run, local1[-1])

    # --- round 2: a clean round after all that ---
    local2 = [run.group(t.node, round_=2) for _ in range(q)]
    peers2 = [run.group(peer, round_=2) for peer in PEERS]
    for group in peers2:
        run.swarm(group)
    for group in local2:
        run.local(group)
    got2 = run.wait_batch(2, t.timeout_s)
    if not run.r.add(
        "a clean round after bad input",
        "§8.3",
        got2 is not None,
        "batch 2 emitted" if got2 else f"no batch 2 within {t.timeout_s:.0f} s",
    ):
        return
    run.tail.pump(1.0)
    _check_never_batched(run, refused, replayed=honest.group_id)
    _check_sequence(run)


def _check_identity(run: _Run, record: Record, batch: batch_pb2.TrainingBatch, sequence: int) -> None:
    node, key = run.t.node, record.key
    expected_id = f"{node}/{sequence}"
    problems = []
    if batch.batch_id != expected_id or key != expected_id.encode():
        problems.append(f"batch id {batch.batch_id!r} with key {key!r}, expected {expected_id!r} for both")
    if batch.node_id != node or batch.schema_version != SCHEMA_VERSION:
        problems.append(f"node_id {batch.node_id!r}, schema_version {batch.schema_version}")
    if batch.target_policy_version != batch.sequence:
        problems.append(f"target_policy_version {batch.target_policy_version} != sequence {batch.sequence}")
    run.r.add(
        "batch id, key and fields",
        "§4.2",
        not problems,
        "; ".join(problems) or f"{expected_id}: key, node, schema, target version",
    )
    problem = header_problem(record, "TrainingBatch", node)
    run.r.add(
        "batch headers", "§3.1", problem is None, problem or "sapo-type, sapo-node-id, sapo-schema-version"
    )


def _check_mix(run: _Run, batch: batch_pb2.TrainingBatch, local: set[str], external: set[str]) -> None:
    sources = [bg.source for bg in batch.groups]
    ids = [bg.group.group_id for bg in batch.groups]
    n_local, n_external = sources.count(LOCAL), sources.count(EXTERNAL)
    problems = []
    if (n_local, n_external) != (LOCAL_GROUPS, EXTERNAL_GROUPS):
        problems.append(
            f"{n_local} local + {n_external} external groups, expected {LOCAL_GROUPS} + {EXTERNAL_GROUPS}"
        )
    if sources != sorted(sources, key=lambda s: s != LOCAL):
        problems.append("external groups before local ones")
    wrong = [
        gid for gid, s in zip(ids, sources, strict=True) if gid not in (local if s == LOCAL else external)
    ]
    if wrong:
        problems.append(f"groups {wrong} are not round-0 groups of their stated source")
    run.r.add(
        "I local + J external groups",
        "§8.3",
        not problems,
        "; ".join(problems) or f"{n_local} local + {n_external} external, one per peer",
    )


def _check_rewards(run: _Run, batch: batch_pb2.TrainingBatch, liar: str) -> None:
    reward_problems: list[str] = []
    advantage_problems: list[str] = []
    for bg in batch.groups:
        record = run.records.get(bg.group.group_id)
        if record is None:
            continue
        texts = [c.text for c in bg.group.completions]
        expected = material.truth(record, texts)
        got = list(bg.rewards)
        if len(got) != len(texts) or any(abs(a - b) > 1e-6 for a, b in zip(got, expected, strict=False)):
            who = "the lying peer's" if bg.group.group_id == liar else f"{bg.group.node_id}'s"
            shown, truth = [round(x, 3) for x in got], [round(x, 3) for x in expected]
            reward_problems.append(f"{who} group has rewards {shown}, the verifier gives {truth}")
        advantage_problems += _advantage_problems(bg)
    run.r.add(
        "receiver's own rewards",
        "§8.4",
        not reward_problems,
        "; ".join(reward_problems)
        or "every group re-scored by the task's verifier (the lying peer's claims ignored)",
    )
    run.r.add(
        "group-relative advantages",
        "§8.4",
        not advantage_problems,
        "; ".join(advantage_problems) or "one per completion, finite, centred, ordered as the rewards",
    )


def _advantage_problems(bg: batch_pb2.BatchGroup) -> list[str]:
    rewards, advantages = list(bg.rewards), list(bg.advantages)
    gid = bg.group.group_id
    if len(advantages) != len(rewards) or not all(math.isfinite(a) for a in advantages):
        return [f"group {gid}: {len(advantages)} advantages for {len(rewards)} rewards, or not finite"]
    if abs(sum(advantages)) > 1e-3 * max(1, len(advantages)):
        return [f"group {gid}: advantages sum to {sum(advantages):.4f}, not 0"]
    for i in range(len(rewards)):
        for j in range(len(rewards)):
            if rewards[i] > rewards[j] + 1e-9 and not advantages[i] > advantages[j]:
                a, b = advantages[i], advantages[j]
                return [f"group {gid}: reward {rewards[i]} > {rewards[j]} but advantage {a:.3f} <= {b:.3f}"]
    return []


def _check_offsets(run: _Run, batch: batch_pb2.TrainingBatch) -> None:
    def covered(position: Position) -> bool:
        topic, partition, offset = position
        return any(
            r.topic == topic and r.partition == partition and r.first <= offset <= r.last
            for r in batch.offsets
        )

    missing = [
        bg.group.group_id
        for bg in batch.groups
        if bg.group.group_id in run.positions and not covered(run.positions[bg.group.group_id])
    ]
    run.r.add(
        "offsets name the consumed input",
        "§4.2",
        not missing,
        f"groups {missing} lie outside the batch's offset ranges"
        if missing
        else f"{len(batch.offsets)} ranges cover every group",
    )


def _check_commits_held(run: _Run, held_local: Position, held_swarm: Position) -> None:
    """Pooled groups are unfinished: neither group's committed offset may pass them. Watched for
    `quiet_s` and until the commits reached them (everything before them is finished)."""
    local_tp, swarm_tp = held_local[:2], held_swarm[:2]
    limit = {local_tp: held_local[2], swarm_tp: held_swarm[2]}
    beyond: list[str] = []
    reached = False
    deadline = time.monotonic() + max(run.t.quiet_s, 1.0)
    long_deadline = time.monotonic() + run.t.timeout_s
    while not beyond and time.monotonic() < long_deadline and (time.monotonic() < deadline or not reached):
        seen = run.local_commits.offsets([local_tp]) | run.swarm_commits.offsets([swarm_tp])
        for tp, offset in seen.items():
            if offset > limit[tp]:
                group = run.local_commits.group if tp == local_tp else run.swarm_commits.group
                beyond.append(
                    f"{group} committed {topic_label(tp[0])}/{tp[1]} up to {offset} while the group at "
                    f"offset {limit[tp]} was pooled and in no batch"
                )
        reached = all(seen[tp] == limit[tp] for tp in limit)
        run.tail.pump(0.3)
    run.r.add(
        "commits only finished input",
        "§5.3",
        not beyond,
        "; ".join(beyond)
        or f"stayed at the first pooled groups (offset {limit[local_tp]} local, {limit[swarm_tp]} swarm)",
    )
    run.r.add(
        "commits what is finished",
        "§5.3",
        reached or bool(beyond),
        "round 0's input committed once its batch was out"
        if reached
        else f"round 0's input was not committed within {run.t.timeout_s:.0f} s",
    )


def _check_commits_done(run: _Run, last_local: rollout_pb2.RolloutGroup) -> None:
    position = run.positions[last_local.group_id]
    tp = position[:2]
    done = run.tail.wait(lambda: run.local_commits.offsets([tp])[tp] > position[2] or None, run.t.timeout_s)
    run.r.add(
        "commits input once its batch is out",
        "§5.3",
        bool(done),
        f"{run.local_commits.group} committed past round 1's local groups"
        if done
        else f"{run.local_commits.group} did not commit past offset {position[2]} within "
        f"{run.t.timeout_s:.0f} s of batch 1",
    )


def _send_refused(run: _Run, batch0: batch_pb2.TrainingBatch) -> tuple[dict[str, str], list[Rejected]]:
    """Send everything the sampler must not batch; returns {group id: why} and the dead letters due."""
    node, swarm = run.t.node, run.topics.swarm_rollouts
    refused: dict[str, str] = {}
    dead: list[Rejected] = []

    def send(group: rollout_pb2.RolloutGroup, why: str, dlq: str | None = None) -> None:
        value = group.SerializeToString()
        position = run.send(swarm, group)
        refused[group.group_id] = why
        if dlq is not None:
            dead.append(Rejected(position, group.group_id.encode(), value, dlq, why))

    send(run.group(node, round_=1), "own group on the swarm topic")
    tampered = run.group(PEERS[1], round_=1)
    tampered.question.answer += "0"
    send(tampered, "group whose answer is not its provenance's", "answer_mismatch")
    send(run.group(PEERS[1], (False, False, False, False), round_=1), "group without signal")
    eval_record = next(material.questions(split="eval"))
    eval_group = material.group(eval_record, PEERS[0], round_=1)
    run.records[eval_group.group_id] = eval_record
    send(eval_group, "group of an eval question")
    send(run.group(PEERS[0], round_=1, completed_s=time.time() - 30 * 86_400), "group completed 30 days ago")
    foreign = run.group(PEERS[0], round_=1)
    provenance = foreign.question.provenance  # self-consistent, but no accepted profile's configuration
    provenance.config_json = canonical_json(json.loads(provenance.config_json) | {"kit_size": 10**9})
    provenance.config_digest = sha256_hex(provenance.config_json)
    send(foreign, "group of a dataset configuration the node does not accept")
    malformed = run.group(PEERS[0], round_=1)
    malformed.completions[0].finish_reason = rollout_pb2.FINISH_REASON_UNSPECIFIED
    send(malformed, "group with a completion lacking its finish reason", "missing_finish_reason")
    wide = run.group(PEERS[0], round_=1)
    while len(wide.completions) <= MAX_GROUP_COMPLETIONS:
        wide.completions.add().CopyFrom(wide.completions[len(wide.completions) % 4])
    send(wide, f"group of more than {MAX_GROUP_COMPLETIONS} completions", "too_many_completions")
    junk_headers = [
        (H_TYPE, b"RolloutGroup"),
        (H_NODE, PEERS[1].encode()),
        (H_SCHEMA, str(SCHEMA_VERSION).encode()),
        (H_TASK, b"basic_arithmetic"),
    ]
    junk = b"\x0a\xff\xff\xff"
    position = run.out.send(swarm, b"kit-junk", junk, junk_headers)
    dead.append(Rejected(position, b"kit-junk", junk, "undecodable", "undecodable record"))
    replayed = next(bg.group for bg in batch0.groups if bg.group.node_id == PEERS[1])
    again = copy.deepcopy(replayed)
    again.round = 1
    run.swarm(again)  # its id was batched in round 0
    return refused, dead


def _check_never_batched(run: _Run, refused: dict[str, str], replayed: str) -> None:
    uses: dict[str, list[str]] = {}
    for _, batch in run.batches():
        for bg in batch.groups:
            uses.setdefault(bg.group.group_id, []).append(batch.batch_id)
    problems = [f"the {why} ({gid}) is in {uses[gid]}" for gid, why in refused.items() if gid in uses]
    twice = {gid: ids for gid, ids in uses.items() if len(ids) > 1}
    problems += [f"group {gid} is in {ids}" for gid, ids in twice.items()]
    run.r.add(
        "refuses what it must",
        "§8.2",
        not problems,
        "; ".join(problems)
        or f"none of {len(refused)} refused groups in a batch; no group in two batches "
        f"(the replayed id {replayed[:8]} too)",
    )


def _check_sequence(run: _Run) -> None:
    sequences = sorted(b.sequence for _, b in run.batches())
    ok = sequences == list(range(len(sequences)))
    run.r.add(
        "gapless batch sequence",
        "§4.2",
        ok,
        f"sequences {sequences}" if not ok else f"batches 0..{len(sequences) - 1}, each once",
    )
