"""The sampler service: two consumer loops around the pure `SamplerCore`, and batch publishing.

Delivery semantics (at-least-once in; batch ids out exactly once):
- Input: the node's rollout topic (LOCAL) and the swarm topic (EXTERNAL, possibly on another
  cluster), each through its own ConsumerLoop, both driven by `step()` from one thread. A rejected or
  duplicate group is DONE at once (malformed and unverifiable ones are dead-lettered too). A pooled
  group is HELD, and finished only when the batch holding it is acknowledged by the broker
  (`send_sync`) or when it is discarded (expired, evicted, unused after its round, or, with
  SAPO_SAMPLER_VERIFY=lazy, rejected when the selection picked and verified it: dead-lettered first
  when it is not what its provenance says, as eager verification would have on arrival). Offsets are
  committed only up to the lowest unfinished one (Watermarks), so a crash re-delivers every pooled
  group and every group of a batch that was not yet acknowledged.
- Idempotency keys: the group id on the way in, the batch id `<node_id>/<sequence>` on the way out.
  On start the batch topic is read to its end (`sapo.node.recovery`) before anything is consumed: the
  sequence continues after the last batch, and groups already in a batch seed the dedupe set, so
  their re-delivery is rejected as "duplicate". A SIGKILL at any moment therefore neither loses nor
  repeats a batch, and no group lands in two batches.
- The sequence never falls behind the trainer's: recovery also reads the node's policy topic, and a
  follower (`sapo.node.trained`) polls it in every step before the node's own groups, so a node whose
  batch topic was re-created while its checkpoints stayed numbers its next batch where the trainer
  expects it (`sapo.sampler.core`; counted in sapo_sampler_sequence_jumps_total).
- A batch the broker does not acknowledge in time raises DeliveryError and the process exits; the
  restart is safe for the same reason (the batch is either in the topic and recovered, or not).
- SIGTERM: the current step ends, both consumers commit what is finished and leave the group; the
  pool is re-delivered to the next start.
- Lazy verification (SAPO_SAMPLER_VERIFY=lazy): a swarm record with a facts header
  (`sapo.wire.GroupFacts`) is screened and pooled on its headers and never decoded unless the
  selection picks it; one without (an older sender) is decoded on arrival as in eager mode.
- Identity (`IDENTITY__MODE` strict or tofu): every swarm record's signature is verified before it
  is decoded (`sapo.sampler.sender`), and the decoded group must name the verified node; the keys
  topic, when followed, is read to its end before the swarm stream is consumed, then polled in
  every step. Hostile records (forged, impersonating, header/body mismatch) are dead-lettered.
- Load shedding: a live swarm record whose node header names a peer that has no place left in the
  pool (its fair share taken, `sapo.sampler.fairness`; the streaming round modes) is refused
  "pool_full" first, before it is identified, decoded or screened (`SamplerCore.sheds`): no content
  could have pooled it, and in a large swarm most arrivals are such (61-79% at 10,000 nodes). It is
  counted, not inspected: a malformed or forged record among them is not dead-lettered, and with
  identity on it is not counted for the peer it claims (a claim nobody checked). With identity off
  the claim is the sender, so one that is no node id is refused as "bad_node_id" first
  (`sapo.sampler.sender`).
- Per-peer accounting: every swarm group whose sender is established (verified, with identity on)
  is counted for that peer as received, then rejected by reason (at screening or as a pool discard)
  or used (in an acknowledged batch), in metrics with a bounded peer label (`sapo.node.peers`) and
  in each batch's `intake` (the counts since the previous batch, `sapo.sampler.intake`), which the
  trainer copies into its step record. The intake counted since the last batch is lost on restart.
- Warm start (`SAPO_SAMPLER_WARM_START__ENABLED`, `sapo.sampler.warm`): a node whose batch topic
  holds no live batch first reads the swarm topic's history (`sapo.node.warm`, never committing),
  through the same identification, decoding and screen as live records (`_judge`), and publishes
  its warm-start batches before either stream is opened. An invalid history record is counted, not
  dead-lettered: the live stream reads it again and dead-letters it then.
- Generator settings: every local group's `sapo-generator-config` fingerprint is counted over a
  recent window (`sapo.sampler.configs`) in sapo_sampler_generator_configs, and a new one is logged
  with the one before it: above 1, the node's generator replicas publish with different settings. A
  group without the header (an older generator) is taken as before and counts as no fingerprint.
- One sampler per node: it owns the batch sequence (run the Deployment with one replica). If a
  rebalance still takes partitions away, their pooled groups are dropped unfinished and forgotten by
  the dedupe set, so the new owner's copy is accepted.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Self

from sapo.identity import HOSTILE, IDENTITY_REASONS, IdentityError, Sender, TrustStore
from sapo.kafka import ConsumerClient, ConsumerLoop, DeadLetters, Disposition, Publisher, Record
from sapo.kafka import TransportMetrics as Transport
from sapo.kafka.consumer import LOOP_REASONS
from sapo.kafka.metrics import catalogue
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag
from sapo.node.identity import HOSTILE_ANNOUNCEMENTS, IdentityGate, IdentityMetrics, KeysFollower
from sapo.node.lease import LEASE_REASONS, Lease, node_lease
from sapo.node.metrics import SamplerMetrics
from sapo.node.peers import PeerLabels
from sapo.node.recovery import read_history
from sapo.node.trained import TRAINED_REASONS, TrainerFollower
from sapo.node.warm import Admit, run_warm_start
from sapo.ops import Health
from sapo.runtime import Runtime
from sapo.sampler import (
    HEADER_REASONS,
    MALFORMED_REASONS,
    ORIGINS,
    Assembly,
    Discard,
    History,
    Origin,
    SamplerCore,
    Scored,
    Unread,
    arrival_facts,
    claimed_sender,
    header_reason,
    needs_warm_start,
    parse,
    sender_of,
)
from sapo.sampler.configs import WINDOW_S, GeneratorConfigs
from sapo.sampler.intake import IntakeTally
from sapo.sampler.settings import SamplerSettings
from sapo.settings import ConfigError
from sapo.topics import TopicNames
from sapo.v1.rollout_pb2 import RolloutGroup
from sapo.wire import (
    H_FACTS,
    H_GENERATOR_CONFIG,
    H_NODE,
    Headers,
    InvalidMessageError,
    header_str,
    message_headers,
    now_timestamp,
    read_generator_config,
)

log = logging.getLogger(__name__)
AdmitUnread = Callable[[Unread, Sender, float], str | None]
"""Admits a swarm record on its facts header, undecoded (`SamplerCore.admit_unread`)."""

SERVICE = "sampler"
REFUSALS = catalogue(
    LOOP_REASONS,
    HEADER_REASONS,
    (r for r in IDENTITY_REASONS if r in HOSTILE),
    MALFORMED_REASONS,
    TRAINED_REASONS,
    LEASE_REASONS,
    sorted(HOSTILE_ANNOUNCEMENTS),
)
"""Every reason the sampler's loops reject or dead-letter a record for (`sapo.kafka.TransportMetrics`):
the header prefilter's, a group's that is hostile, malformed or not what its provenance says (on
arrival, or when lazy verification picks it), the trainer's announcements', the leases' and the key
announcements'. The reasons a group is only counted for are `sapo.sampler.REASONS`."""
IDLE_WAIT_S = 0.02
"""Pause after a step in which no stream had a record (polls are non-blocking so that one busy stream
is never slowed down by waiting on the other); each further idle step doubles it up to
`IDLE_WAIT_MAX_S`, and a record read resets it."""
IDLE_WAIT_MAX_S = 0.1
"""Longest idle pause. Every wake-up costs CPU whatever the step does (a timed wait alone ~0.1-0.15 ms
on a 2-core VM): an idle sampler process took 15-16 ms of CPU a second pausing 20 ms, 6.3 backing
off to 100 ms. A record that arrives in a pause waits for its end: at most this, on top of the
consumer's fetch wait."""
PUBLISH_TIMEOUT_S = 30.0
SWARM_BURST = 64
"""Swarm records handled per step at most. The rest of a step (the trainer's and the node's own
streams polled, discards settled, health and gauges) is then paid once per burst rather than once per
record: a large swarm's records arrive far faster than anything else, and that work costs ~11 us of
CPU a step (real clients, 2-core machine), a third of a lazily screened record's ~30. A batch is still
emitted as soon as a record that joined the pool makes it due. A refused record (most of a large
swarm's) leaves the pool as it was, so nothing is asked after it: a batch that only time makes due
(expiry, a deadline) waits for the end of the burst, at most 64 records later."""


class Accounting:
    """What the sampler counts of every record it reads: by origin and reason in its metrics, and,
    for a swarm group whose sender is established, per peer in its metrics (`sapo.node.peers`) and
    in the intake the next batch carries (`sapo.sampler.intake`). Kept apart from the service so that
    `bench/bench_sampler.py` pays per record what the service pays."""

    def __init__(self, metrics: SamplerMetrics, intake: IntakeTally) -> None:
        self._metrics = metrics
        self._intake = intake

    def prefiltered(self, origin: Origin, reason: str | None) -> str | None:
        """A record read, and the header prefilter's verdict on it (returned)."""
        self._metrics.consumed.inc(origin)
        if reason is not None:
            self._metrics.rejected.inc(reason)
        return reason

    def refused(self, reason: str) -> None:
        self._metrics.rejected.inc(reason)

    def screened(self, origin: Origin, peer: str, reason: str | None) -> None:
        """The verdict on a group `peer` sent: pooled (None) or the reason it was not."""
        if origin == "external" and peer:
            self._metrics.peers.screened(peer, reason)
            self._intake.received(peer, reason)

    def discarded(self, scored: Scored, reason: str) -> None:
        """A pooled group left the pool unused."""
        self._metrics.rejected.inc(reason)
        if scored.origin == "external":
            self.peer_discarded(scored.peer, reason)

    def peer_discarded(self, peer: str, reason: str) -> None:
        self._metrics.peers.rejected(peer, reason)
        self._intake.rejected(peer, reason)


class SamplerService:
    """Drives both streams into the core and publishes its batches; see the module docstring."""

    def __init__(
        self,
        settings: SamplerSettings,
        topics: TopicNames,
        *,
        history: History,
        publisher: Publisher,
        local_client: ConsumerClient,
        swarm_client: ConsumerClient,
        metrics: SamplerMetrics,
        transport: Transport,
        health: Health,
        stop: StopFlag,
        dead_letters: DeadLetters | None,
        identity: IdentityGate | None = None,
        lease: Lease | None = None,
        trainer_client: ConsumerClient | None = None,
        warm_client: ConsumerClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._identity = identity
        self._lease = lease
        self._topics = topics
        self._publisher = publisher
        self._metrics = metrics
        self._health = health
        self._stop = stop
        self._clock = clock
        self._transport = transport
        self._dead_letters = dead_letters
        self._warm_client = warm_client
        self._idle_wait_s = IDLE_WAIT_S
        self._pooled = False
        """A record joined the pool since the last look for a due batch."""
        self.core: SamplerCore[Record] = settings.core(history)
        self._intake = IntakeTally()
        self._accounts = Accounting(metrics, self._intake)
        self._configs = GeneratorConfigs()
        self._jumped(
            history.next_sequence,
            f"the trainer's announcement of v{history.trainer_version} expects sequence "
            f"{history.trainer_next_sequence}",
        )

        def loop(client: ConsumerClient, topic: str, origin: Origin) -> ConsumerLoop:
            return ConsumerLoop(
                client,
                [topic],
                functools.partial(self._handle, origin),
                stop=stop,
                metrics=transport,
                dead_letters=dead_letters,
                prefilter=functools.partial(self._prefilter, origin),
                stream_of=lambda _topic: origin,
                on_revoke=self._revoked,
                poll_timeout_s=0.0,
                max_payload_bytes=settings.max_payload_bytes,
            )

        self.local = loop(local_client, topics.rollouts, "local")
        self.swarm = loop(swarm_client, topics.swarm_rollouts, "external")
        self.trainer: TrainerFollower | None = None
        if trainer_client is not None:
            self.trainer = TrainerFollower(
                trainer_client,
                topics.policy,
                settings.node_id,
                self._follow_trainer,
                transport=transport,
                stop=stop,
                max_payload_bytes=settings.max_payload_bytes,
            )

    @classmethod
    def prepare(cls, settings: SamplerSettings) -> Callable[[Runtime], Self | None]:
        """The trust list (and pins) identity needs, read before any connection opens: a missing or
        broken one fails at start saying what to set, not once the lease is taken. Returns what wires
        the service to a runtime (`from_runtime`), which reads them again once it holds the lease."""
        trust_store(settings)
        return functools.partial(cls.from_runtime, settings)

    @classmethod
    def from_runtime(cls, settings: SamplerSettings, runtime: Runtime) -> Self | None:
        """Take the node's sampler lease (a standby waits), recover the history from the batch topic,
        then wire the service; None if stopped meanwhile."""
        lease = node_lease(runtime, settings, SERVICE)
        if not lease.acquire():  # recovery reads the batch topic only once no other sampler writes it
            return None
        runtime.health.require("partitions_assigned", "recovered")  # after: a standby is ready
        # Read with the lease held: the sampler a standby replaces kept pinning meanwhile, and a store
        # read at start would lack those pins and drop them from the pins file at its first own pin.
        trust = trust_store(settings)
        identity = None if trust is None else identity_gate(runtime, settings, trust)
        history = read_history(
            runtime.consumer("sampler-recovery", per_process=True),
            runtime.topics.batches,
            settings.node_id,
            max_bytes=settings.max_payload_bytes,
            idle_s=settings.recovery_idle_s,
            timeout_s=settings.recovery_timeout_s,
            stop=runtime.stop,
            beat=runtime.health.beat,
            policy_topic=runtime.topics.policy,
        )
        if history is None:
            return None
        if identity is not None:  # every key announced so far is known before any group is judged
            identity.open()
            idle_s, timeout_s = settings.identity.keys_idle_s, settings.recovery_timeout_s
            if not identity.catch_up(idle_s, timeout_s, runtime.health.beat):
                return None
        runtime.health.set("recovered", True)
        warm_client = None  # never commits, so each start reads the history afresh (sapo.node.warm)
        if settings.warm_start.enabled and needs_warm_start(history):
            warm_client = runtime.consumer("sampler-warm", swarm=True, per_process=True)
        shortfall = settings.external_shortfall()
        if shortfall is not None:
            log.warning("%s", shortfall)
        return cls(
            settings,
            runtime.topics,
            history=history,
            publisher=runtime.publisher,
            local_client=runtime.consumer("sampler"),
            swarm_client=runtime.consumer("sampler-swarm", swarm=True),
            metrics=SamplerMetrics(runtime.registry, PeerLabels(settings.node_id, settings.metrics_peers)),
            transport=runtime.transport,
            health=runtime.health,
            stop=runtime.stop,
            dead_letters=runtime.dead_letters,
            identity=identity,
            lease=lease,
            trainer_client=runtime.consumer("sampler-policy", per_process=True, watch=True),
            warm_client=warm_client,
        )

    @property
    def sequence(self) -> int:
        """The next batch's sequence."""
        return self.core.sequence

    def run(self) -> None:
        """Consume and emit until the stop flag is set."""
        if self.trainer is not None:
            self.trainer.open()
        if not self._warm_start():
            return
        self.local.open()
        self.swarm.open()
        while not self._stop.is_set():
            self.step()

    def step(self) -> bool:
        """One poll of the trainer's and the node's own stream (the trainer's announcements first),
        up to `SWARM_BURST` records of the swarm's, then emit every due batch; True when a record was
        read."""
        if self._identity is not None:
            self._identity.poll()
        if self._lease is not None:
            self._lease.check()
        # The trainer's announcements before the node's groups (sapo.node.trained).
        got = self.trainer is not None and self.trainer.loop.opened and self.trainer.step()
        got = self.local.step(0.0) or got
        if got:
            self._emit_due()  # what the trainer's or the node's own record made due, before the swarm's
        read = 0
        while read < SWARM_BURST and self.swarm.step(0.0):
            read += 1
            if self._pooled:  # a batch as soon as a pooled record makes it due, as if in its own step
                self._emit_due()
        got = got or read > 0
        self._emit_due()
        self._settle_discards()
        self._health.beat()
        self._health.set("partitions_assigned", bool(self.local.assigned) and bool(self.swarm.assigned))
        for origin in ORIGINS:
            self._metrics.pool_of[origin].set(self.core.assembler.pool.count(origin))
        self._metrics.generator_configs.set(self._configs.count(self._clock()))
        if got:
            self._idle_wait_s = IDLE_WAIT_S
        else:
            self._stop.wait(self._idle_wait_s)
            self._idle_wait_s = min(2 * self._idle_wait_s, IDLE_WAIT_MAX_S)
        return got

    def close(self) -> None:
        """Commit what is finished on both streams and leave their groups."""
        try:
            self.local.close()
        finally:
            self.swarm.close()
            if self.trainer is not None:
                self.trainer.close()
            if self._identity is not None:
                self._identity.close()
            if self._lease is not None:
                self._lease.release()

    def _prefilter(self, origin: Origin, record: Record) -> str | None:
        return self._accounts.prefiltered(origin, header_reason(record.headers, origin, self.core.screen.cfg))

    def _handle(self, origin: Origin, record: Record) -> Disposition:
        if origin == "local":
            self._observe_config(record.headers)
        try:
            reason = self._admit(origin, record)
        except InvalidMessageError as exc:  # counted here; the loop dead-letters and finishes it
            self._accounts.refused(exc.reason)
            raise
        if reason is not None:
            self._accounts.refused(reason)
            return Disposition.DONE
        self._pooled = True
        return Disposition.HELD

    def _observe_config(self, headers: Headers) -> None:
        """Count the generator settings fingerprint of a local group, and log one new to the window."""
        config = read_generator_config(headers)
        if config is None:  # an older generator's group: no fingerprint to count
            return
        new = self._configs.observe(config, self._clock())
        if new is None:
            return
        self._metrics.generator_configs.set(new.configs)
        if not new.previous:
            log.info("local generators publish with settings fingerprint %s", new.config)
        elif new.configs == 1:
            log.info("local generator settings changed: fingerprint %s -> %s", new.previous, new.config)
        else:
            log.warning(
                "local generator settings differ: fingerprint %s after %s, %d fingerprints within %.0f s: "
                "this node's generator replicas run different settings (each logs its own at start), "
                "expected only while a rolling update runs; groups of one work item may differ (%s)",
                new.config,
                new.previous,
                new.configs,
                WINDOW_S,
                H_GENERATOR_CONFIG,
            )

    def _admit(self, origin: Origin, record: Record) -> str | None:
        """Identify, decode and admit one live record; the reason it was not pooled."""
        claimed = None
        if origin == "external" and (claimed := header_str(record.headers, H_NODE)):
            shed = self.core.sheds(claimed)  # load shedding before any work: `SamplerCore.sheds`
            if shed is not None:
                if self._identity is None:  # the header is who sent it (bad_node_id when it names
                    # nobody); with identity, only a claim
                    self._accounts.screened(origin, claimed_sender(claimed).node_id, shed)
                return shed

        def admit(group: RolloutGroup, sender: Sender, now: float) -> str | None:
            previous = self.core.sequence
            reason = self.core.admit(group, origin, record, now, sender)
            why = f"local group {group.group_id} sampled with policy v{group.policy_version}"
            self._jumped(previous, why)
            return reason

        def admit_unread(unread: Unread, sender: Sender, now: float) -> str | None:
            return self.core.admit_unread(unread, record, now, sender)

        return self._judge(origin, record, admit, admit_unread, claimed)

    def _judge(
        self,
        origin: Origin,
        record: Record,
        admit: Admit,
        admit_unread: AdmitUnread | None = None,
        claimed: str | None = None,
    ) -> str | None:
        """Identify (before decoding) and decode one record, then `admit` it and count the verdict per
        peer; the reason it was not taken. The one path of live and warm-start records. With
        `admit_unread` (live records), a lazy sampler admits a swarm record with a facts header
        undecoded instead (`sapo.sampler.screen.arrival_facts`). `claimed`: its node header, when
        already read (`sapo.sampler.sender.sender_of`)."""
        now = self._clock()
        node, gate = self._settings.node_id, self._identity
        sender = sender_of(
            record.headers, record.value, origin, node_id=node, store=gate, now_s=now, claimed=claimed
        )
        if isinstance(sender, str):
            return sender
        peer = sender.node_id  # "" with identity off and no node header: the body names it
        headers = record.headers
        if gate is not None and origin != "local" and not sender.facts_signed:
            # Facts no signature covers (an older signer, or a copy whose v2 signature was stripped):
            # set aside, the body decoded on arrival (`sapo.identity.signing`).
            headers = {name: v for name, v in headers.items() if name != H_FACTS}
        try:
            facts = arrival_facts(headers, origin, self.core.screen.cfg) if admit_unread else None
            if facts is not None and admit_unread and peer and record.value is not None:
                reason = admit_unread(Unread(record.value, headers, facts), sender, now)
                self._accounts.screened(origin, peer, reason)
                return reason
            group = parse(record.value, self._settings.max_payload_bytes, headers)
            peer = peer or group.node_id
            reason = admit(group, sender, now)
        except InvalidMessageError as exc:
            self._accounts.screened(origin, peer, exc.reason)
            raise
        self._accounts.screened(origin, peer, reason)
        return reason

    def _warm_start(self) -> bool:
        """Train on the swarm's history first when the node has trained nothing (`sapo.node.warm`);
        False when stopped meanwhile."""
        warm = self.core.warm_start(self._settings.warm_start.config()) if self._warm_client else None
        if warm is None or self._warm_client is None:
            return True
        return run_warm_start(
            self.core,
            warm,
            self._warm_client,
            self._topics.swarm_rollouts,
            self._settings,
            judge=functools.partial(self._judge, "external"),
            publish=self._publish,
            discarded=self._warm_discarded,
            metrics=self._metrics,
            stop=self._stop,
            beat=self._warm_beat,
            now_s=self._clock(),
        )

    def _warm_discarded(self, discard: Discard[Record]) -> None:
        """A kept history group evicted or left unused: counted per peer (nothing to finish)."""
        self._accounts.peer_discarded(discard.entry.scored.peer, discard.reason)

    def _warm_beat(self) -> None:
        """Alive, and still the lease holder (renewed), however long the history takes to read."""
        self._health.beat()
        if self._lease is not None:
            self._lease.check()

    def _follow_trainer(self, next_sequence: int, version: int) -> None:
        previous = self.core.sequence
        self.core.follow_trainer(next_sequence, version)
        self._jumped(previous, f"the trainer announced v{version} and expects sequence {next_sequence}")

    def _jumped(self, previous: int, why: str) -> None:
        """Log and count a batch sequence that moved forward to follow the trainer (module docstring)."""
        if self.core.sequence > previous:
            log.warning(
                "batch sequence %d -> %d: %s; this node's batch topic lost its history (re-created "
                "with the checkpoints kept?)",
                previous,
                self.core.sequence,
                why,
            )
            self._metrics.sequence_jumps.inc()

    def _emit_due(self) -> None:
        self._pooled = False
        while (assembly := self.core.next_batch(self._clock())) is not None:
            self._publish(assembly)

    def _publish(self, assembly: Assembly[Record]) -> None:
        node = self._settings.node_id
        entries = assembly.entries
        positions = [(e.handle.topic, e.handle.partition, e.handle.offset) for e in entries]
        batch = self.core.build(assembly, positions, now_timestamp())
        self._intake.used(e.scored.peer for e in entries if e.scored.origin == "external")
        batch.intake.extend(self._intake.take())
        if self._lease is not None:
            self._lease.check(before_write=True)  # a fenced sampler stops here, before it writes
            batch.epoch = self._lease.epoch
        value = batch.SerializeToString()
        headers = message_headers("TrainingBatch", node, value)
        key = batch.batch_id.encode()
        self._publisher.send_sync(self._topics.batches, key, value, headers, timeout_s=PUBLISH_TIMEOUT_S)
        if assembly.warm:  # history is read, never consumed: no offset to finish (sapo.node.warm)
            self._metrics.warm_batches.inc()
            self._metrics.warm_used.inc(len(entries))
        else:
            for entry in entries:
                self._loop_of(entry.handle).finish(entry.handle)
        self._observe_batch(assembly, [e.scored for e in entries])
        log.info(
            "emitted %s: %d local + %d external groups (round %s%s)",
            batch.batch_id,
            len(assembly.local),
            len(assembly.external),
            batch.round,
            ", warm start" if assembly.warm else "",
        )
        self.core.emitted()

    def _observe_batch(self, assembly: Assembly[Record], groups: list[Scored]) -> None:
        now = self._clock()
        self._metrics.batches.inc()
        if assembly.waited_out:
            self._metrics.waited_out.labels(self._settings.round_mode).inc()
        self._metrics.batch_groups.labels("local").observe(len(assembly.local))
        self._metrics.batch_groups.labels("external").observe(len(assembly.external))
        self._metrics.peers.used(s.peer for s in groups if s.origin == "external")
        for scored in groups:
            if scored.origin == "local":
                self._metrics.staleness.observe(max(0, self.sequence - scored.group.policy_version))
            if scored.completed_s > 0 and not assembly.warm:  # history's age would swamp the live one's
                self._metrics.age.labels(scored.origin).observe(max(0.0, now - scored.completed_s))

    def _settle_discards(self) -> None:
        for discard in self.core.take_discards():
            record = discard.entry.handle
            if discard.error is not None:  # failed verification at selection: as the loop does on arrival
                log.warning(
                    "rejected %s/%d/%d: %s", record.topic, record.partition, record.offset, discard.error
                )
                self._transport.rejected.inc(discard.reason)
                if self._dead_letters is not None:
                    self._dead_letters.send(record, discard.reason, discard.error.detail)
            self._loop_of(record).finish(record)
            self._accounts.discarded(discard.entry.scored, discard.reason)

    def _loop_of(self, record: Record) -> ConsumerLoop:
        return self.local if record.topic == self._topics.rollouts else self.swarm

    def _revoked(self, tps: list[TopicPartition]) -> None:
        gone = set(tps)
        pool = self.core.assembler.pool
        self.core.forget({e.group_id for o in ORIGINS for e in pool.entries(o) if e.handle.tp in gone})


def trust_store(settings: SamplerSettings) -> TrustStore | None:
    """The trust store identity settings name; None with identity off. ConfigError saying what to set."""
    try:
        return settings.identity.store()
    except IdentityError as exc:
        raise ConfigError(f"SAPO_SAMPLER_IDENTITY: {exc}") from None


def identity_gate(runtime: Runtime, settings: SamplerSettings, store: TrustStore) -> IdentityGate:
    """The trust store's gate: its keys-topic follower and metrics."""
    metrics = IdentityMetrics(runtime.registry, SERVICE)
    follower = None
    if settings.identity.keys_topic:
        follower = KeysFollower(
            runtime.consumer("sampler-keys", swarm=True, per_process=True),
            runtime.topics.swarm_keys,
            store,
            metrics=metrics,
            transport=runtime.transport,
            stop=runtime.stop,
            dead_letters=runtime.dead_letters,
        )
    return IdentityGate(store, metrics, follower=follower, pins_file=settings.identity.pins_file)
