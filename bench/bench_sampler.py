"""Sampler filter throughput for a 1,000-node swarm (or `--nodes 10000`), against the raw consume rate of
the same messages.

Real RolloutGroups (questions from each node's own easy-profile task stream, 8 completions that are
the right answer or a wrong one with the sender's honest rewards, prompt token ids and per-token
logprobs as a generator sends them: about 2.4 KB each, with the headers a generator writes, the
`sapo-group-facts` header among them) from `--nodes` node ids go into one topic on the embedded
broker. Then, alternating so machine noise hits every path alike, each path reads the whole topic
through the real ConsumerLoop in a fresh consumer group:

- raw: a no-op handler (the ceiling: broker fetch + the loop's bookkeeping);
- prefilter: the header prefilter of a node that accepts one task of four (3/4 dropped unread),
  survivors to a no-op handler;
- eager: what the service does with SAPO_SAMPLER_VERIFY=eager: decode, validate, identity, age,
  dedupe, re-derivation from provenance, re-scoring of every distinct completion text, signal filter,
  advantages, pooling; and a batch of I=4 local / J=4 external groups emitted every
  `--batch-every` groups read (default 1,000: each peer of 1,000 sends one group per batch, ~4x more
  batches per group read than a 1,000-node swarm sharing 8 groups per round causes, 40x at 10,000);
- lazy: the same with SAPO_SAMPLER_VERIFY=lazy: arrivals are screened on the facts header alone
  (never decoded: `Screen.check_facts`) and pooled as bytes; the J groups a batch picks are decoded,
  checked against their headers, re-derived and re-scored then. The time spent emitting batches is
  also reported per selected external group (the deferred verification);
- lazy-old: lazy for an older sender's records (the facts header ignored): decoded and validated on
  arrival, then the cheap filters and the claimed-signal check;
- node: a node that trains on one task of four, eager: header prefilter, then the full pipeline.

Every full path holds a pooled group's record (its offset uncommittable) until the group leaves the
pool in a batch or as a discard, and finishes it then through the loop, as the service does. Every
full path also counts each record as the service does (`sapo.node.sampler.Accounting`: the header
prefilter with its metrics, the verdict per reason and per peer, the intake a batch carries), refuses
a group whose peer has no place left in the pool before anything else (`SamplerCore.sheds`), and
asks whether a batch is due after every record that joined the pool and once per burst of
`SWARM_BURST` records. The rest of a service step (its other streams
polled, discards settled, health, gauges) is paid once per burst of up to `SWARM_BURST` swarm records
and is not in these figures.

Fresh dedupe set, verifier caches and pool per pass. The I=4 local groups of each batch are
verified before the timing (local groups are verified on arrival in both modes and come from the
node's own generator, not from this topic). Everything alive before the passes is frozen out of the
garbage collector, as a service does before its loop (`sapo.runtime.freeze_startup_objects`), and
the garbage of the passes before is collected before each pass's timing starts. Rates
count from the first record read (the group join is excluded); "paired" is the median over rounds of
a path's rate over the raw rate of the same round; "cpu us" is this process's CPU time per message
(the consumer: Python and librdkafka's threads, not the broker's), and "cpu" its ratio to raw's: the
rate ratio of a sampler with a core of its own and the broker elsewhere, as in a deployment. Target:
eager or lazy >= 0.5 x raw (PASS/FAIL on the paired ratio).

Run to run the raw rate moves with the host and the broker's fetches, and with it the paired ratio
(the same code has read either side of the target in consecutive runs): a change smaller than that
spread needs interleaved A/B runs of the code before and after to show.

    .venv/bin/python bench/bench_sampler.py [--nodes 1000] [--groups-per-node 20] [--rounds 5]

What it read as the code changed, run by run: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sapo.broker import EmbeddedBroker
from sapo.convert import question_to_proto
from sapo.identity import Sender
from sapo.kafka import (
    ConsumerLoop,
    Disposition,
    KafkaConsumerClient,
    KafkaPublisher,
    Record,
    TransportMetrics,
)
from sapo.kafka.consumer import Prefilter
from sapo.lifecycle import StopFlag
from sapo.node.metrics import SamplerMetrics
from sapo.node.peers import PeerLabels
from sapo.node.sampler import SWARM_BURST, Accounting
from sapo.runtime import freeze_startup_objects
from sapo.sampler import (
    Assembler,
    RoundMode,
    Scored,
    Screen,
    ScreenConfig,
    SeenGroups,
    Unread,
    VerifyMode,
    arrival_facts,
    claimed_sender,
    header_reason,
    make_assembler,
    parse,
    sender_of,
)
from sapo.sampler.fairness import Admission
from sapo.sampler.intake import IntakeTally
from sapo.sampler.screen import unread_scored
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConsumerProfile
from sapo.tasks import EASY_PROFILE, TaskStream, score
from sapo.topics import TopicSpec, ensure_topics
from sapo.v1 import rollout_pb2
from sapo.wire import H_NODE, SCHEMA_VERSION, header_str, now_timestamp, rollout_headers

TOPIC = "bench.swarm.rollouts"
RECEIVER = "receiver"
COMPLETIONS = 8
PROMPT_TOKENS = 200
COMPLETION_TOKENS = 16
LOCAL_GROUPS, EXTERNAL_GROUPS = 4, 4
GROUPS_PER_ROUND = 8
"""Groups each node shares per round (the paper's questions per round, all shared): the offered load
is nodes x 8 / round_s groups/s."""


Message = tuple[bytes, bytes, list[tuple[str, bytes]]]


def build_group(node_id: str, stream: TaskStream, rng: random.Random) -> rollout_pb2.RolloutGroup:
    """One group as a generator publishes it, with the sender's honest rewards."""
    record = next(stream)
    # Like a small model at temperature 1: some right, the rest spread over a few wrong answers.
    answers = [record.answer if rng.random() < 0.35 else str(rng.randrange(5)) for _ in range(COMPLETIONS)]
    texts = [f"{a}</answer>" for a in answers]
    rewards = {t: score(record, t, prefilled=True) for t in set(texts)}
    return rollout_pb2.RolloutGroup(
        schema_version=SCHEMA_VERSION,
        group_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        node_id=node_id,
        question=question_to_proto(record),
        completions=[
            rollout_pb2.Completion(
                text=text,
                token_ids=[rng.randrange(49152) for _ in range(COMPLETION_TOKENS)],
                logprobs=[-rng.random() for _ in range(COMPLETION_TOKENS)],
                finish_reason=rollout_pb2.FINISH_REASON_STOP,
                reward=rewards[text],
            )
            for text in texts
        ],
        model_id="bundled:smollm2-135m-instruct",
        policy_version=0,
        prompt_token_ids=[rng.randrange(49152) for _ in range(PROMPT_TOKENS)],
        sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=64),
        created_at=now_timestamp(),
        completed_at=now_timestamp(),
    )


def build_messages(nodes: int, per_node: int, seed: int) -> list[Message]:
    """(key, value, headers) of nodes x per_node groups, interleaved across nodes as a swarm sends."""
    rng = random.Random(seed)
    streams = [TaskStream(EASY_PROFILE, node_seed=n, split="train") for n in range(nodes)]
    messages = []
    for _ in range(per_node):
        for node, stream in enumerate(streams):
            group = build_group(f"node-{node}", stream, rng)
            value = group.SerializeToString()
            messages.append((group.group_id.encode(), value, rollout_headers(group, value)))
    return messages


def build_local(count: int, seed: int) -> list[Scored]:
    """`count` of the receiver's own groups with signal, verified as the sampler does on arrival."""
    rng = random.Random(seed)
    stream = TaskStream(EASY_PROFILE, node_seed=10**6, split="train")
    screen = Screen(screen_config(None, VerifyMode.EAGER), SeenGroups(1_000_000))
    out: list[Scored] = []
    while len(out) < count:
        verdict = screen.check(build_group(RECEIVER, stream, rng), "local", time.time(), 0, Sender(RECEIVER))
        if isinstance(verdict, Scored):
            out.append(verdict)
    return out


def timed_read(
    bootstrap: str,
    count: int,
    handler: Callable[[Record], Disposition],
    prefilter: Prefilter | None,
    sampler: Sampler | None = None,
) -> tuple[float, float]:
    """(msgs/s, CPU microseconds of this process per message) of one full pass over the topic in a
    fresh group, from the first record on. The CPU time is the consumer's own (Python and the
    librdkafka threads), without the broker's, which here shares the machine. A full path's `sampler`
    finishes the records it held through this loop, as the service does."""
    config = {"bootstrap.servers": bootstrap} | ConsumerProfile.local().to_librdkafka()
    client = KafkaConsumerClient(config, f"bench.{uuid.uuid4().hex[:8]}")
    metrics = TransportMetrics(CollectorRegistry(), "bench")
    loop = ConsumerLoop(client, [TOPIC], handler, stop=StopFlag(), metrics=metrics, prefilter=prefilter)
    if sampler is not None:
        sampler.finish = loop.finish
    loop.open()
    try:
        while not loop.step(0.5):
            pass
        gc.collect()  # the passes before left cyclic garbage (a sampler's bound methods): not this pass's
        start, cpu, read = time.perf_counter(), time.process_time(), 1
        while read < count:
            read += loop.step(0.5)
        return (count - 1) / (time.perf_counter() - start), 1e6 * (time.process_time() - cpu) / (count - 1)
    finally:
        loop.close()


def settings(accepted: frozenset[str] | None, verify: VerifyMode) -> SamplerSettings:
    """The receiving sampler: async rounds of I/J 4/4, every group young enough to use."""
    return SamplerSettings(
        node_id=RECEIVER,
        accepted_tasks=accepted,
        verify=verify,
        round_mode=RoundMode.ASYNC,
        local_groups=LOCAL_GROUPS,
        external_groups=EXTERNAL_GROUPS,
        max_external_age_s=3600.0,
        max_policy_lag=1_000_000,  # the pre-verified local groups stay usable
    )


def screen_config(accepted: frozenset[str] | None, verify: VerifyMode) -> ScreenConfig:
    return settings(accepted, verify).screen_config()


@dataclass
class Sampler:
    """The service's pipeline without Kafka: screen, pool, and a batch every `batch_every` groups
    read. Counts verdicts, times the batch emission and, within it, the deferred verifications."""

    screen: Screen
    batch_every: int
    local: Iterator[Scored]
    facts: bool = True  # lazy: screen on the facts header when there is one (False: as an older sender)
    verdicts: dict[str, int] = field(default_factory=dict)
    read: int = 0
    batches: int = 0
    external_picked: int = 0
    emit_s: float = 0.0
    verified: int = 0
    verify_s: float = 0.0
    finish: Callable[[Record], None] | None = None
    """The loop's `finish`: a pooled record is held until its batch or its discard, as in the service."""

    def __post_init__(self) -> None:
        service = settings(self.screen.cfg.accepted_tasks, self.screen.cfg.verify)
        cfg = service.assembly_config()
        self.assembler: Assembler[Record | None] = make_assembler(cfg, verify=self._verify)
        # The service's counting of every record (metrics, per-peer metrics, the batches' intake).
        metrics = SamplerMetrics(CollectorRegistry(), PeerLabels(RECEIVER, service.metrics_peers))
        self.accounts = Accounting(metrics, IntakeTally())

    def prefilter(self, record: Record) -> str | None:
        """The service's header prefilter, counting every record read."""
        reason = header_reason(record.headers, "external", self.screen.cfg)
        return self.accounts.prefiltered("external", reason)

    def handle(self, record: Record) -> Disposition:
        now = time.time()
        node = header_str(record.headers, H_NODE)
        shed = self.assembler.sheds(node)  # as the service: no place for this peer, nothing else done
        if shed is not None:
            node = claimed_sender(node).node_id  # as the service without identity: a claim checked
        verdict = self._admit(record, now, node) if shed is None else shed
        self._count(verdict)
        reason = None if verdict == "pooled" else verdict
        self.accounts.screened("external", node, reason)
        self.read += 1
        arrived = self.read % self.batch_every == 0
        if arrived:  # the node's own groups of one batch arrive
            while self.assembler.pool.count("local") < LOCAL_GROUPS:
                self.assembler.add(next(self.local), None, now)
        # As the service: a batch is looked for after a record joined the pool and after each burst.
        if reason is None or arrived or self.read % SWARM_BURST == 0:
            self._emit_due(now)
        if reason is None:
            return Disposition.HELD
        self.accounts.refused(reason)
        return Disposition.DONE

    def _admit(self, record: Record, now: float, node: str) -> str:
        sender = sender_of(
            record.headers, record.value, "external", node_id=RECEIVER, store=None, now_s=now, claimed=node
        )
        assert isinstance(sender, Sender) and record.value is not None
        facts = arrival_facts(record.headers, "external", self.screen.cfg) if self.facts else None
        if facts is not None:  # as SamplerCore.admit_unread: no decoding on arrival
            return self._admit_unread(Unread(record.value, record.headers, facts), record, now, sender)
        group = parse(record.value, 1 << 20, record.headers)
        screened = self.screen.check(group, "external", now, self.batches, sender)
        return screened if isinstance(screened, str) else self._add(screened, record, now)

    def _admit_unread(self, unread: Unread, record: Record, now: float, sender: Sender) -> str:
        reason = self.screen.facts_reason(unread, now, sender.node_id)
        if reason is not None:
            return reason
        place = self.assembler.place("external", sender.node_id, unread.facts.round)
        if isinstance(place, str):
            return place
        return self._add(unread_scored(unread, sender.node_id), record, now, place)

    def _add(self, scored: Scored, record: Record, now: float, place: Admission | None = None) -> str:
        refusal = self.assembler.add(scored, record, now, place)
        if refusal is not None:
            return refusal
        self.screen.seen.add(scored.group_id)
        return "pooled"

    def _verify(self, scored: Scored) -> Scored | str:
        start = time.perf_counter()
        try:
            return self.screen.verify(scored)
        finally:
            self.verify_s += time.perf_counter() - start
            self.verified += 1

    def _emit_due(self, now: float) -> None:
        start = time.perf_counter()
        batch = self.assembler.next_batch(now, self.batches)
        self.emit_s += time.perf_counter() - start
        if batch is not None:
            self.batches += 1
            self.external_picked += len(batch.external)
            for entry in batch.external:
                self._finish(entry.handle)
        for discard in self.assembler.take_discards():
            self._count(f"pool:{discard.reason}")
            self._finish(discard.entry.handle)
            self.accounts.discarded(discard.entry.scored, discard.reason)

    def _finish(self, record: Record | None) -> None:
        if record is not None and self.finish is not None:
            self.finish(record)

    def _count(self, key: str) -> None:
        self.verdicts[key] = self.verdicts.get(key, 0) + 1


Path = tuple[Callable[[Record], Disposition], Prefilter | None]


def paths(
    accepted_one: frozenset[str], local: list[Scored], batch_every: int
) -> tuple[dict[str, Path], dict[str, Sampler]]:
    """Each path's (handler, prefilter), and the Sampler behind each full path (fresh per pass)."""
    one_task = screen_config(accepted_one, VerifyMode.EAGER)

    def noop(_record: Record) -> Disposition:
        return Disposition.DONE

    def one_task_prefilter(record: Record) -> str | None:
        return header_reason(record.headers, "external", one_task)

    def sampler(cfg: ScreenConfig, facts: bool = True) -> Sampler:
        return Sampler(Screen(cfg, SeenGroups(1_000_000)), batch_every, iter(local), facts)

    samplers = {
        "eager": sampler(screen_config(None, VerifyMode.EAGER)),
        "lazy": sampler(screen_config(None, VerifyMode.LAZY)),
        "lazy-old": sampler(screen_config(None, VerifyMode.LAZY), facts=False),
        "node": sampler(one_task),
    }
    full: dict[str, Path] = {name: (s.handle, s.prefilter) for name, s in samplers.items()}
    return {"raw": (noop, None), "prefilter": (noop, one_task_prefilter)} | full, samplers


def cost_per_message(messages: list[Message], sample: int = 2000) -> dict[str, float]:
    """Microseconds per message of each arrival stage, without the broker (no pooling)."""
    values = [v for _, v, _ in messages[-sample:]]
    headers = [dict(h) for _, _, h in messages[-sample:]]
    groups = [parse(v, 1 << 20) for v in values]
    out = {}
    start = time.perf_counter()
    for v in values:
        parse(v, 1 << 20)
    out["decode + validate"] = 1e6 * (time.perf_counter() - start) / len(values)
    for verify in VerifyMode:
        screen = Screen(screen_config(None, verify), SeenGroups(1_000_000))
        start = time.perf_counter()
        for group in groups:
            screen.check(group, "external", time.time(), 0, Sender(group.node_id))
        out[f"check, {verify}"] = 1e6 * (time.perf_counter() - start) / len(groups)
    screen = Screen(screen_config(None, VerifyMode.LAZY), SeenGroups(1_000_000))
    start = time.perf_counter()
    for value, hs, group in zip(values, headers, groups, strict=True):
        facts = arrival_facts(hs, "external", screen.cfg)
        assert facts is not None
        screen.check_facts(Unread(value, hs, facts), time.time(), Sender(group.node_id))
    out["facts + check, lazy"] = 1e6 * (time.perf_counter() - start) / len(groups)
    return out


def report(
    rates: dict[str, list[float]],
    cpu: dict[str, list[float]],
    samplers: dict[str, Sampler],
    messages: list[Message],
    offered: float,
) -> None:
    raw, raw_cpu = statistics.median(rates["raw"]), statistics.median(cpu["raw"])
    paired = {name: paired_ratio(values, rates["raw"]) for name, values in rates.items()}
    head = ("msgs/s", "vs raw", "paired", "us/msg", "cpu us", "cpu")
    print(
        "path      "
        + " ".join(f"{h:>{w}}" for h, w in zip(head, (9, 7, 7, 7, 7, 6), strict=True))
        + "   runs"
    )
    for name, values in rates.items():
        median, median_cpu = statistics.median(values), statistics.median(cpu[name])
        runs = " ".join(f"{v:,.0f}" for v in values)
        print(
            f"{name:<10}{median:>9,.0f} {median / raw:>7.3f} {paired[name]:>7.3f} {1e6 / median:>7.1f} "
            f"{median_cpu:>7.1f} {raw_cpu / median_cpu:>6.3f}   {runs}"
        )
    for name in ("eager", "lazy", "lazy-old"):
        s = samplers[name]
        print(
            f"{name} (last pass): {s.batches} batches of I={LOCAL_GROUPS}/J={EXTERNAL_GROUPS} "
            f"({s.external_picked} external groups); due checks and batches "
            f"{1e6 * s.emit_s / s.read:.1f} us per message read ({1000 * s.emit_s / max(1, s.batches):.2f} "
            f"ms per batch); of that, {s.verified} deferred verifications, "
            f"{1000 * s.verify_s / max(1, s.verified):.3f} ms per selected group"
        )
        print(f"  verdicts: {dict(sorted(s.verdicts.items()))}")
    for stage, us in cost_per_message(messages).items():
        print(f"  no broker: {stage:<20} {us:7.1f} us per message")
    # The whole process: the simulated swarm's messages are held in memory too, so this bounds the
    # sampler's own footprint from above.
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the bench process (messages + samplers): {peak_mib:,.0f} MiB")
    best = max(statistics.median(rates["eager"]), statistics.median(rates["lazy"]))
    keeps_up = "keeps" if best >= offered else "does not keep"
    print(f"best full path {best:,.0f} msgs/s {keeps_up} up with the swarm's {offered:,.0f} groups/s")
    ratio = max(paired["eager"], paired["lazy"])
    print(f"{'PASS' if ratio >= 0.5 else 'FAIL'}: best full path {ratio:.3f} x raw, paired (target >= 0.5)")


def paired_ratio(values: list[float], raw: list[float]) -> float:
    """Median over rounds of a path's rate over the raw rate of the same round: the passes of one
    round run within seconds of each other, so load from other jobs that comes and goes between
    rounds moves both sides of each ratio."""
    return statistics.median(v / r for v, r in zip(values, raw, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--groups-per-node", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-every", type=int, default=1000, help="groups read per emitted batch")
    parser.add_argument(
        "--round-s",
        type=float,
        default=10.0,
        help="round length the keep-up line assumes (bench_swarm_load's fast GPU swarm)",
    )
    args = parser.parse_args()

    started = time.perf_counter()
    messages = build_messages(args.nodes, args.groups_per_node, seed=1)
    local = build_local(LOCAL_GROUPS * (len(messages) // args.batch_every + 1), seed=2)
    size = statistics.mean(len(v) for _, v, _ in messages)
    took = time.perf_counter() - started
    print(f"built {len(messages)} groups from {args.nodes} nodes, {size:.0f} B each, in {took:.1f} s")
    with EmbeddedBroker() as broker:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, [TopicSpec(TOPIC)], timeout_s=30)
        pub = KafkaPublisher({"bootstrap.servers": broker.bootstrap, "linger.ms": "20"})
        for key, value, headers in messages:
            pub.send(TOPIC, key, value, headers)
        assert pub.flush(60) == 0
        del pub  # an open producer connection holds the broker's shutdown up by seconds
        freeze_startup_objects()  # as a service before its loop (here also the simulated swarm's messages)
        names = ("raw", "prefilter", "eager", "lazy", "lazy-old", "node")
        rates: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            handlers, samplers = paths(frozenset({EASY_PROFILE[0].name}), local, args.batch_every)
            for name, (handler, prefilter) in handlers.items():
                rate, cpu_us = timed_read(
                    broker.bootstrap, len(messages), handler, prefilter, samplers.get(name)
                )
                rates[name].append(rate)
                cpu[name].append(cpu_us)
    report(rates, cpu, samplers, messages, args.nodes * GROUPS_PER_ROUND / args.round_s)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
