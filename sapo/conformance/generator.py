"""The generator scenario: the kit plays the node's trainer (checkpoints in the store, announcements on
the policy topic, work items on the work topic) and reads what the generator writes (its groups on
the rollout and swarm topics, dead letters) and commits.

1. Version 0 (the model's own weights) announced, round 0 planned: one well-formed group per item.
2. Round 1 planned before version 1 exists: nothing may be sampled for it, and its items must stay
   uncommitted. Version 1 (perturbed weights) announced: round 1 sampled with it (hot reload).
3. An obsolete round-0 item, malformed work items and announcements (undecodable, another node's,
   an empty version range, one without a digest, one of a fenced-out trainer's epoch that names a
   version 2), then round 2 with no upper version bound: sampled with version 1, not 2.

No round 0 in time while the generator's consumer group has committed nothing says whether the group
had a member that finished joining it (a first join can outlast a short `--timeout`).
"""

from __future__ import annotations

import time

import torch
from google.protobuf.message import Message

from sapo.checkpoints import CheckpointStore
from sapo.conformance.common import (
    GeneratorTarget,
    Position,
    Rejected,
    Sender,
    Target,
    check_dead_letters,
    decoded,
    header_problem,
    unread,
)
from sapo.conformance.observe import Committed, Tail
from sapo.conformance.results import Results
from sapo.convert import question_from_proto
from sapo.generator.work import Item, group_id
from sapo.inspect.render import topic_label
from sapo.kafka import Record
from sapo.models import load_model
from sapo.tasks import MAX_POSITION, verify_question
from sapo.v1 import policy_pb2, rollout_pb2
from sapo.wire import (
    H_TASK,
    SCHEMA_VERSION,
    header_str,
    message_headers,
    now_timestamp,
    validate_rollout_group,
)

TRAINER_EPOCH = 1
"""The epoch the kit's announcements and work items carry, as a trainer holding the lease would."""


class _Run:
    def __init__(self, target: Target, extra: GeneratorTarget, results: Results) -> None:
        self.t = target
        self.x = extra
        self.r = results
        self.topics = target.topics
        self.out = Sender(target.kafka, target.metadata_timeout_s)
        topics = [self.topics.rollouts, self.topics.swarm_rollouts, self.topics.dlq]
        self.tail = Tail(target.consumer, topics, target.metadata_timeout_s)
        self.commits = Committed(target.consumer, target.group("generator"), target.metadata_timeout_s)
        self.partitions = self.out.partitions(self.topics.work)
        self.model, _ = load_model(extra.model)
        self.store = CheckpointStore(extra.checkpoint_root, keep_last=10)

    def close(self) -> None:
        self.tail.close()
        self.commits.close()

    def groups(self) -> list[tuple[Record, rollout_pb2.RolloutGroup]]:
        found = decoded(self.tail.on(self.topics.rollouts), rollout_pb2.RolloutGroup)
        return [(r, g) for r, g in found if g is not None]

    def of_round(self, round_: int) -> list[rollout_pb2.RolloutGroup]:
        return [g for _, g in self.groups() if g.round == round_]

    def version(
        self, version: int, *, epoch: int = TRAINER_EPOCH, perturb: float = 0.0
    ) -> policy_pb2.PolicyUpdate:
        """Store a version of the generator's model (its weights moved by `perturb`-scaled noise)
        and return the announcement a trainer would make of it."""
        if perturb:
            noise = torch.Generator().manual_seed(version)
            with torch.no_grad():
                for param in self.model.parameters():
                    param.add_(torch.randn(param.shape, generator=noise) * perturb)
        published = self.store.publish(self.t.node, version, self.model.state_dict(), base_model=self.x.model)
        if published.written is None:
            raise RuntimeError(f"{self.x.checkpoint_root} already holds newer versions of {self.t.node}")
        return policy_pb2.PolicyUpdate(
            schema_version=SCHEMA_VERSION,
            node_id=self.t.node,
            version=version,
            manifest_uri=published.written.manifest_uri,
            manifest_sha256=published.written.manifest_sha256,
            created_at=now_timestamp(),
            epoch=epoch,
        )

    def announce(self, version: int, *, perturb: float = 0.0) -> None:
        self.send_update(self.version(version, perturb=perturb))

    def send_update(self, update: policy_pb2.PolicyUpdate) -> Position:
        value = update.SerializeToString()
        headers = message_headers("PolicyUpdate", self.t.node, value)
        return self.out.send(self.topics.policy, self.t.node.encode(), value, headers)

    def plan(
        self, round_: int, low: int, high: int | None, positions: range | None = None
    ) -> dict[int, Position]:
        """Work items of a round as the trainer publishes them (partition = position mod partitions)."""
        sent: dict[int, Position] = {}
        q = self.t.questions_per_round
        for position in positions if positions is not None else range(q):
            item = Item(self.t.node, round_, position, round_ * q + position, low, high).to_proto(
                TRAINER_EPOCH
            )
            value = item.SerializeToString()
            headers = message_headers("WorkItem", self.t.node, value)
            key = f"{round_}/{position}".encode()
            sent[position] = self.out.send(self.topics.work, key, value, headers)
        return sent

    def wait_round(self, round_: int, count: int, timeout_s: float) -> list[rollout_pb2.RolloutGroup] | None:
        def complete() -> list[rollout_pb2.RolloutGroup] | None:
            groups = {g.position: g for g in self.of_round(round_)}
            return list(groups.values()) if len(groups) >= count else None

        return self.tail.wait(complete, timeout_s)


def run(target: Target, extra: GeneratorTarget, results: Results) -> None:
    run = _Run(target, extra, results)
    try:
        _scenario(run)
    finally:
        run.close()


def _scenario(run: _Run) -> None:
    t, topics, q = run.t, run.topics, run.t.questions_per_round
    run.announce(0)
    done = run.plan(0, 0, 0)
    round0 = run.wait_round(0, q, t.timeout_s)
    if not run.r.add(
        "one group per work item",
        "§7.1",
        round0 is not None,
        f"{q} groups of round 0 on {topics.rollouts}"
        if round0
        else f"{len({g.position for g in run.of_round(0)})} of {q} round-0 groups within {t.timeout_s:.0f} s "
        "of version 0 and round 0's work items" + unread(t, [(run.commits, list(done.values()))]),
    ):
        return
    _check_groups(run, 0, expected_version=0)
    run.tail.pump(1.0)  # the swarm copies, sent with the private ones
    _check_shared(run)

    held = run.plan(1, 1, 1)
    _check_waits(run, held, done)
    run.announce(1, perturb=1e-2)
    round1 = run.wait_round(1, q, t.timeout_s)
    versions = sorted({g.policy_version for g in run.of_round(1)})
    run.r.add(
        "hot-reloads an announced version",
        "§7.2",
        round1 is not None and versions == [1],
        "round 1 sampled with version 1 once announced"
        if round1 and versions == [1]
        else f"round 1 groups carry versions {versions} (expected [1]) after version 1 was announced",
    )

    dead = _send_refused(run)
    run.plan(0, 0, 0, positions=range(1))  # obsolete: the generator holds version 1 now
    run.plan(2, 1, None)
    round2 = run.wait_round(2, q, t.timeout_s)
    run.r.add(
        "keeps going after bad input",
        "§5.5",
        round2 is not None,
        "round 2 sampled after the refused input"
        if round2
        else f"no complete round 2 within {t.timeout_s:.0f} s",
    )
    run.tail.pump(t.quiet_s / 2)
    versions2 = sorted({g.policy_version for g in run.of_round(2)})
    run.r.add(
        "ignores a fenced-out trainer's version",
        "§6",
        versions2 == [1],
        "round 2 sampled with version 1, not the fenced version 2"
        if versions2 == [1]
        else f"round 2 groups carry versions {versions2}, expected [1]: the update of epoch "
        f"{TRAINER_EPOCH - 1} < {TRAINER_EPOCH} was loaded",
    )
    stale = [g.group_id for g in run.of_round(0) if g.policy_version != 0]
    run.r.add(
        "drops items the policy moved past",
        "§7.1",
        not stale,
        f"round-0 groups sampled with a later version: {stale}"
        if stale
        else "the round-0 item re-planned after version 1 was dropped",
    )
    check_dead_letters(run.r, run.tail, topics, dead, t.timeout_s)
    _check_groups(run, 1, expected_version=1)


def _check_groups(run: _Run, round_: int, expected_version: int) -> None:
    """Ids, keys, headers, fields and completions of a round's groups (contract sections 3.1, 7.3)."""
    problems: list[str] = []
    for record, group in run.groups():
        if group.round != round_:
            continue
        expected_id = group_id(run.t.node, group.round, group.position)
        if group.group_id != expected_id or record.key != expected_id.encode():
            problems.append(
                f"group {group.group_id} (key {record.key!r}) of item {round_}/{group.position}: "
                f"expected {expected_id} as id and key"
            )
        problem = header_problem(record, "RolloutGroup", run.t.node) or validate_rollout_group(group)
        if problem is None and header_str(record.headers, H_TASK) != group.question.task:
            problem = (
                f"sapo-task header {header_str(record.headers, H_TASK)!r} != task {group.question.task!r}"
            )
        if problem:
            problems.append(f"group {group.group_id}: {problem}")
        problems += _content_problems(group, expected_version)
        if problems:
            break
    run.r.add(
        f"round {round_} groups well-formed",
        "§7.3",
        not problems,
        "; ".join(problems) or "ids from (node, round, position), keys, headers, provenance, completions",
    )


def _content_problems(group: rollout_pb2.RolloutGroup, expected_version: int) -> list[str]:
    gid = group.group_id
    problems = []
    if group.schema_version != SCHEMA_VERSION or group.policy_version != expected_version:
        problems.append(f"group {gid}: schema {group.schema_version}, policy version {group.policy_version}")
    reason = verify_question(question_from_proto(group.question))
    if reason is not None:
        problems.append(f"group {gid}: its question does not re-derive from its provenance ({reason})")
    if len(group.completions) < 2 or not group.sampling.temperature > 0 or not group.sampling.max_new_tokens:
        problems.append(f"group {gid}: {len(group.completions)} completions, sampling {group.sampling}")
    for c in group.completions:
        failed = c.finish_reason == rollout_pb2.FINISH_REASON_ERROR
        if c.HasField("reward") == failed or (c.HasField("reward") and not 0.0 <= c.reward <= 1.0):
            reward = c.reward if c.HasField("reward") else "unset"
            finish = rollout_pb2.FinishReason.Name(c.finish_reason)
            problems.append(f"group {gid}: reward {reward} for a {finish} completion")
            break
    if not group.completed_at.seconds:
        problems.append(f"group {gid}: no completed_at")
    return problems


def _check_shared(run: _Run) -> None:
    private = {r.key: r for r in run.tail.on(run.topics.rollouts)}
    shared = [r for r in run.tail.on(run.topics.swarm_rollouts) if r.key in private]
    problems = [
        f"swarm copy of {r.key!r} differs from the private one"
        for r in shared
        if r.value != private[r.key].value or r.headers != private[r.key].headers
    ]
    run.r.add(
        "shares exact copies",
        "§7.4",
        not problems,
        "; ".join(problems)
        or f"{len(shared)} of {len(private)} groups on {run.topics.swarm_rollouts}, byte-identical",
    )
    if run.x.trust is None:
        run.r.skip(
            "signs shared groups", "§3.2", "no trust list given (--trust-file): signatures not checked"
        )
        return
    bad = []
    for record in shared:
        verdict = run.x.trust.identify(record.headers, record.value or b"", time.time())
        node = getattr(verdict, "node_id", None)
        if node != run.t.node:
            bad.append(f"{record.key!r}: {getattr(verdict, 'reason', node)}")
    run.r.add(
        "signs shared groups",
        "§3.2",
        bool(shared) and not bad,
        "; ".join(bad)
        if bad
        else f"{len(shared)} signatures verified against the trust list"
        if shared
        else "no shared group to verify",
    )


def _check_waits(run: _Run, held: dict[int, Position], done: dict[int, Position]) -> None:
    """Round 1's items need version 1, which does not exist yet: nothing may be sampled for them and
    their offsets must not be committed; round 0's, whose groups are out, must be."""
    t = run.t
    tps = sorted({p[:2] for p in (*held.values(), *done.values())})
    limit = {tp: min((p[2] for p in held.values() if p[:2] == tp), default=None) for tp in tps}
    beyond: list[str] = []
    committed: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + t.quiet_s
    while time.monotonic() < deadline and not beyond:
        committed = run.commits.offsets(tps)
        for tp, offset in committed.items():
            bound = limit[tp]
            if bound is not None and offset > bound:
                beyond.append(
                    f"{run.commits.group} committed {topic_label(tp[0])}/{tp[1]} up to {offset}, past the "
                    f"waiting item at {bound}"
                )
        run.tail.pump(0.5)
    early = [f"{g.round}/{g.position} with v{g.policy_version}" for g in run.of_round(1)]
    run.r.add(
        "waits for the version an item needs",
        "§7.1",
        not early,
        f"sampled {early} while only version 0 was announced (the items need version 1)"
        if early
        else f"no round-1 group for {t.quiet_s:.0f} s while only version 0 existed",
    )
    run.r.add(
        "commits only finished work",
        "§5.2",
        not beyond,
        "; ".join(beyond) or "waiting items stayed uncommitted",
    )
    if beyond:
        return
    unfinished = [p for p in done.values() if committed.get(p[:2], -1) <= p[2]]
    run.r.add(
        "commits finished work",
        "§5.2",
        not unfinished,
        f"round 0's items at {unfinished} not committed {t.quiet_s:.0f} s after their groups were out"
        if unfinished
        else "round 0's items committed once their groups were out",
    )


def _send_refused(run: _Run) -> list[Rejected]:
    node = run.t.node
    dead: list[Rejected] = []

    def send(topic: str, key: bytes, message: Message | bytes, kind: tuple[str, str, str]) -> None:
        """`kind`: the message type, the reason the generator must give, what the message is."""
        msg_type, reason, what = kind
        value = message if isinstance(message, bytes) else message.SerializeToString()
        headers = message_headers(msg_type, node, value)
        position = run.out.send(topic, key, value, headers)
        dead.append(Rejected(position, key, value, reason, what))

    work, policy = run.topics.work, run.topics.policy
    send(work, b"9/0", b"\x0a\xff\xff\xff", ("WorkItem", "undecodable", "undecodable work item"))
    foreign = Item("kit-other", 9, 0, 0, 0, None).to_proto(TRAINER_EPOCH)
    send(work, b"9/1", foreign, ("WorkItem", "wrong_node", "work item for another node"))
    backwards = Item(node, 9, 2, 0, 5, 4).to_proto(TRAINER_EPOCH)
    send(work, b"9/2", backwards, ("WorkItem", "empty_version_range", "work item with min > max"))
    beyond = Item(node, 9, 3, MAX_POSITION, 0, None).to_proto(TRAINER_EPOCH)
    send(work, b"9/3", beyond, ("WorkItem", "index_out_of_range", "work item past the stream's end"))
    far = Item(node, 9, 4, 4, 2**40, None).to_proto(TRAINER_EPOCH)
    send(work, b"9/4", far, ("WorkItem", "version_too_far_ahead", "work item for a version far ahead"))
    incomplete = policy_pb2.PolicyUpdate(schema_version=SCHEMA_VERSION, node_id=node, version=3)
    send(policy, node.encode(), incomplete, ("PolicyUpdate", "incomplete_policy_update", "bare announcement"))
    fenced = run.version(2, epoch=TRAINER_EPOCH - 1, perturb=1e-2)
    send(
        policy, node.encode(), fenced, ("PolicyUpdate", "fenced_update", "fenced-out trainer's announcement")
    )
    return dead
