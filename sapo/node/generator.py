"""The generator service: the node's work items, sampled with the current policy, published as groups.

A node's generator replicas are one consumer group over its work topic (`sapo.generator.work`): each
replica holds the items of the partitions it is assigned. Its loop: read what arrived, then sample
every held item the loaded policy may generate (lock-step: exactly the round's version) in one
backend call, score the groups, publish every group to the node's rollout topic and the shared subset
to the swarm topic, flush, and only then finish the items' offsets. Items that need a newer policy
wait while the policy follower loads it; items the swarm has moved past (lock-step, an older round)
are dropped and counted.

Delivery semantics:
- Stateless: on start a replica reads the compacted policy topic, loads the newest version, then
  consumes work from the group's committed offsets.
- At-least-once: an item's offset is committed only after its group was acknowledged by the broker. A
  replica that dies holding items leaves them uncommitted; after the rebalance another replica samples
  them again. Question, seeds and group id are functions of (node, round, position), so the group is
  the same (the same id; the same completions given the same weights) and the sampler keeps one copy.
- A delivery that fails or does not finish within `flush_timeout_s` raises `DeliveryError` and the
  process exits before committing: the restart samples the items again (same ids).
- Adding or removing a replica is a rebalance: items of a revoked partition are dropped unfinished and
  the partition's new owner samples them.
- A group's policy_version is the version loaded when its backend call started; weights are never
  swapped inside a call, so one group never mixes versions.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple, Self

from sapo.backends import GenerationBackend
from sapo.cpugate import Gate, NoGate
from sapo.generator import Item, generate_items
from sapo.generator.fingerprint import settings_fingerprint
from sapo.generator.settings import BackendKind, GeneratorSettings
from sapo.generator.sharing import scored_rewards
from sapo.identity import IdentityError
from sapo.kafka import (
    ConsumerClient,
    ConsumerLoop,
    DeadLetters,
    DeliveryError,
    Disposition,
    Publisher,
    Record,
    TransportMetrics,
)
from sapo.kafka.consumer import LOOP_REASONS
from sapo.kafka.metrics import catalogue
from sapo.kafka.records import TopicPartition
from sapo.lifecycle import StopFlag
from sapo.models import require_device, require_loadable
from sapo.node.build import build_backend, model_shapes, round_source
from sapo.node.metrics import GeneratorMetrics
from sapo.node.policy import POLICY_REASONS, WEIGHTS_OK, PolicyFollower
from sapo.ops import Health
from sapo.runtime import Runtime
from sapo.settings import ConfigError, env_prefix
from sapo.tasks import MAX_POSITION, QuestionRecord, TaskStream
from sapo.topics import TopicNames
from sapo.v1 import rollout_pb2, work_pb2
from sapo.wire import (
    DECODE_REASONS,
    H_GENERATOR_CONFIG,
    WORK_ITEM_REASONS,
    HeaderSigner,
    InvalidMessageError,
    decode,
    rollout_headers,
    validate_work_item,
)

log = logging.getLogger(__name__)

MODEL_LOADED = "model_loaded"
_WAIT_POLL_S = 0.5
_DRAIN = 4096
_WARN_EVERY_S = 60.0
_FINISHED_MEMORY = 16_384
"""Items this replica published, remembered (newest) so that a copy arriving later is not sampled again."""
WORK_REASONS = (
    *DECODE_REASONS,
    *WORK_ITEM_REASONS,
    "wrong_node",
    "index_out_of_range",
    "version_too_far_ahead",
)
"""Every reason the generator refuses a work item for."""
REFUSALS = catalogue(LOOP_REASONS, WORK_REASONS, POLICY_REASONS)
"""Every reason the generator's loops reject or dead-letter a record for (`sapo.kafka.TransportMetrics`)."""


class Held(NamedTuple):
    """A work item a replica holds: its record (finished once the group is published) and its
    question, built when the item arrived so that an item whose question cannot be built is refused
    alone rather than failing the backend call it would have shared."""

    item: Item
    record: Record
    question: QuestionRecord


Slot = tuple[int, int]
"""(round, position): one work item of the node."""


class HeldItems:
    """The work items a replica holds, indexed by the lowest policy version each needs, so that a step
    looks only at the items the loaded version may serve (many items waiting for later versions cost
    nothing per step)."""

    def __init__(self) -> None:
        self._items: dict[Slot, Held] = {}
        self._by_version: dict[int, dict[Slot, None]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, slot: Slot) -> bool:
        return slot in self._items

    def add(self, held: Held) -> None:
        slot = (held.item.round, held.item.position)
        self._items[slot] = held
        self._by_version.setdefault(held.item.min_version, {})[slot] = None

    def remove(self, slot: Slot) -> None:
        held = self._items.pop(slot, None)
        if held is None:
            return
        version = held.item.min_version
        slots = self._by_version[version]
        del slots[slot]
        if not slots:
            del self._by_version[version]

    def servable(self, loaded: int) -> list[Held]:
        """The held items version `loaded` may serve or has made obsolete, lowest version first."""
        versions = sorted(v for v in self._by_version if v <= loaded)
        return [self._items[slot] for v in versions for slot in self._by_version[v]]

    def lowest_waiting(self, loaded: int) -> int | None:
        """The lowest version above `loaded` that a held item needs (None: no item waits)."""
        return min((v for v in self._by_version if v > loaded), default=None)

    def all(self) -> list[Held]:
        return list(self._items.values())


class GeneratorService:
    """Runs rounds until stopped, `until()` holds, or the round limit is reached."""

    def __init__(
        self,
        settings: GeneratorSettings,
        backend: GenerationBackend,
        follower: PolicyFollower,
        *,
        work_client: ConsumerClient,
        publisher: Publisher,
        swarm_publisher: Publisher,
        topics: TopicNames,
        metrics: GeneratorMetrics,
        transport: TransportMetrics,
        health: Health,
        stop: StopFlag,
        dead_letters: DeadLetters | None = None,
        signer: HeaderSigner | None = None,
        gate: Gate | None = None,
    ) -> None:
        self._settings = settings
        self._gate: Gate = gate or NoGate()
        self._backend = backend
        self._follower = follower
        self._publisher = publisher
        self._swarm_publisher = swarm_publisher
        self._topics = topics
        self._metrics = metrics
        self._health = health
        self._stop = stop
        self._source = round_source(settings, backend.tokenizer)
        self._stream = TaskStream(settings.task_profile(), self._source.node_seed, "train")
        self._signer = signer
        self._fingerprint = settings_fingerprint(settings)
        log.info("settings fingerprint %s (each group's %s header)", self._fingerprint, H_GENERATOR_CONFIG)
        self._held = HeldItems()
        self._finished: OrderedDict[Slot, None] = OrderedDict()
        self.work = ConsumerLoop(
            work_client,
            [topics.work],
            self._hold,
            stop=stop,
            metrics=transport,
            dead_letters=dead_letters,
            stream_of=lambda _topic: "work",
            on_assign=self._assigned,
            on_revoke=self._revoked,
            poll_timeout_s=0.0,
            max_payload_bytes=settings.max_payload_bytes,
        )
        self.generated = 0
        """Groups generated and acknowledged by the broker since start."""

    @classmethod
    def prepare(cls, settings: GeneratorSettings) -> Callable[[Runtime], Self]:
        """The node's signing key, its model and where the model runs (the device, or vLLM), checked
        before anything slow or connected: any missing fails at start saying what to set. Returns what
        wires the service to a runtime (`from_runtime`) with the key read here."""
        try:
            signer = settings.identity.signer()
        except IdentityError as exc:
            raise ConfigError(f"SAPO_GENERATOR_IDENTITY: {exc}") from None
        prefix = env_prefix(settings)
        require_loadable(settings.model, f"{prefix}MODEL")
        if settings.backend is BackendKind.VLLM:
            if importlib.util.find_spec("vllm") is None:
                raise ConfigError(
                    f"{prefix}BACKEND=vllm: vLLM is not installed here (the package's `gpu` extra); install "
                    f"it, or set {prefix}BACKEND=hf"
                )
        else:
            require_device(settings.device, f"{prefix}DEVICE")
        return functools.partial(cls.from_runtime, settings, signer=signer)

    @classmethod
    def from_runtime(
        cls, settings: GeneratorSettings, runtime: Runtime, *, signer: HeaderSigner | None
    ) -> Self:
        """Wire the service to the process's runtime: model, policy follower, publishers, metrics, health."""
        runtime.health.require(MODEL_LOADED, WEIGHTS_OK)
        runtime.health.set_max_silence(settings.liveness_timeout_s)
        backend = build_backend(settings)
        runtime.health.set(MODEL_LOADED, True)
        metrics = GeneratorMetrics(runtime.registry, [spec.name for spec in settings.task_profile()])
        follower = PolicyFollower(
            runtime.consumer("generator-policy", per_process=True),
            topic=runtime.topics.policy,
            node_id=settings.node_id,
            backend=backend,
            metrics=metrics,
            transport=runtime.transport,
            health=runtime.health,
            stop=runtime.stop,
            max_payload_bytes=settings.max_payload_bytes,
            catchup_idle_s=settings.policy_catchup_idle_s,
            reload=settings.reload_policy(),
            dead_letters=runtime.dead_letters,
            shapes=model_shapes(backend),
        )
        return cls(
            settings,
            backend,
            follower,
            work_client=runtime.consumer("generator"),
            publisher=runtime.publisher,
            swarm_publisher=runtime.swarm_publisher,
            topics=runtime.topics,
            metrics=metrics,
            transport=runtime.transport,
            health=runtime.health,
            stop=runtime.stop,
            dead_letters=runtime.dead_letters,
            signer=signer,
            gate=runtime.gate,
        )

    @property
    def backend(self) -> GenerationBackend:
        """The sampling backend (its `model_version` is the loaded policy version)."""
        return self._backend

    def run(self, until: Callable[[], bool] | None = None) -> int:
        """Catch up with the policy topic, then sample work items until stopped (or `until()`); returns
        how many groups were published."""
        self._follower.open()
        try:
            if not self._follower.catch_up():
                return 0
            self.work.open()
            warned = time.monotonic()
            while not self._stop.is_set() and not (until is not None and until()):
                self._health.beat()
                self._read_work()
                self._follower.poll(0.0)
                if self.step():
                    warned = time.monotonic()
                    continue
                if self._held and time.monotonic() - warned > _WARN_EVERY_S:
                    warned = time.monotonic()
                    self._log_waiting()
                self._wait()
        finally:
            self.close()
        log.info("generator stopped after %d groups", self.generated)
        return self.generated

    def close(self) -> None:
        """Commit finished work and leave the work and policy consumer groups (idempotent)."""
        try:
            self.work.close()
        finally:
            self._follower.close()

    def step(self) -> bool:
        """Sample the held items the loaded policy may generate (up to `max_batch_items`), publish their
        groups and finish the items; drop obsolete ones. True when a backend call ran."""
        loaded = self._follower.loaded
        ready: list[Held] = []
        for held in self._held.servable(loaded):
            item = held.item
            if item.fate(loaded) == "obsolete":
                log.info("dropped obsolete item round %d/%d (loaded v%d)", item.round, item.position, loaded)
                self._metrics.work_items.labels("obsolete").inc()
                self._held.remove((item.round, item.position))
                self.work.finish(held.record)
            elif len(ready) < self._settings.max_batch_items:
                ready.append(held)
        self._metrics.work_held.set(len(self._held))
        self._follower.wanted(self._held.lowest_waiting(loaded))
        if not ready:
            return False
        ready.sort(key=lambda held: (held.item.round, held.item.position))
        self.generate([held.item for held in ready], [held.question for held in ready])
        for held in ready:
            slot = (held.item.round, held.item.position)
            self._held.remove(slot)
            self._remember(slot)
            self.work.finish(held.record)
        self.work.commit()
        return True

    def generate(
        self, items: Sequence[Item], questions: Sequence[QuestionRecord]
    ) -> list[rollout_pb2.RolloutGroup]:
        """Sample, score, publish and flush the groups of `items` (whose questions are `questions`) with
        the currently loaded weights."""
        version = self._backend.model_version
        with self._gate.hold():  # sampling and scoring keep a CPU busy (sapo.cpugate)
            generated = generate_items(self._backend, questions, self._source, items, version)
        groups, seconds = generated.groups, generated.generate_seconds
        shared = self._publish(groups)
        self.generated += len(groups)
        self._observe(groups, seconds, shared)
        rounds = sorted({item.round for item in items})
        log.info(
            "rounds %s: %d groups (%d shared) with v%d in %.1fs",
            rounds,
            len(groups),
            shared,
            version,
            seconds,
        )
        return groups

    def _wait(self) -> None:
        """Block (up to `_WAIT_POLL_S`) on the stream that can let the next step run: the policy topic
        while held items wait for a version, else the work topic. The trainer announces a version
        before it plans that round's work, so waiting on the policy alone let a generator that had
        loaded the version sleep out the whole wait while the round's work sat fetched (~0.5 s in
        three of five rounds of a 2-node warm:0 swarm at ~2.9 s per round)."""
        if self._held:
            self._follower.poll(_WAIT_POLL_S)
        else:
            self.work.step(_WAIT_POLL_S)

    def _read_work(self) -> None:
        """Take every work item already fetched (bounded), without waiting."""
        for _ in range(_DRAIN):
            if not self.work.step(0.0):
                break

    def _hold(self, record: Record) -> Disposition:
        message = decode(work_pb2.WorkItem, record.value, self._settings.max_payload_bytes)
        problem = validate_work_item(message)
        if problem is not None:
            raise InvalidMessageError(problem)
        if message.node_id != self._settings.node_id:
            raise InvalidMessageError(
                "wrong_node", f"work for {message.node_id!r} on {self._settings.node_id}'s topic"
            )
        if message.stream_index >= MAX_POSITION:
            raise InvalidMessageError(
                "index_out_of_range", f"stream_index {message.stream_index} outside [0, {MAX_POSITION})"
            )
        lead = message.min_policy_version - self._follower.announced
        if lead > self._settings.max_version_lead:
            raise InvalidMessageError(
                "version_too_far_ahead",
                f"needs policy v{message.min_policy_version}, {lead} past the newest announced "
                f"v{self._follower.announced} (more than {env_prefix(self._settings)}MAX_VERSION_LEAD)",
            )
        item = Item.from_proto(message)
        slot = (item.round, item.position)
        if slot in self._held or slot in self._finished:  # planned twice: one sample does for both
            self._metrics.work_items.labels("duplicate").inc()
            return Disposition.DONE
        self._held.add(Held(item, record, self._stream.record_at(item.stream_index)))
        return Disposition.HELD

    def _remember(self, slot: Slot) -> None:
        self._finished[slot] = None
        if len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)

    def _assigned(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        self._metrics.work_partitions.set(len(self.work.assigned))
        return {}

    def _revoked(self, tps: list[TopicPartition]) -> None:
        """Items of partitions that moved to another replica: dropped unfinished, sampled there."""
        gone = set(tps)
        for held in self._held.all():
            if held.record.tp in gone:
                self._held.remove((held.item.round, held.item.position))
        self._metrics.work_partitions.set(len(self.work.assigned.difference(tps)))

    def _log_waiting(self) -> None:
        needed = self._held.lowest_waiting(self._follower.loaded)
        log.info(
            "%d work items wait for policy v%s (loaded v%d, announced v%d)",
            len(self._held),
            needed,
            self._follower.loaded,
            self._follower.announced,
        )

    def _publish(self, groups: Sequence[rollout_pb2.RolloutGroup]) -> int:
        """Send every group to the private topic and the shared ones to the swarm; flush both."""
        settings = self._settings
        shared = 0
        for group in groups:
            value = group.SerializeToString()
            headers = rollout_headers(group, value, self._signer, self._fingerprint)
            key = group.group_id.encode()
            self._publisher.send(self._topics.rollouts, key, value, headers)
            if settings.shares(group):
                self._swarm_publisher.send(self._topics.swarm_rollouts, key, value, headers)
                shared += 1
        unsent = self._publisher.flush(settings.flush_timeout_s)
        if self._swarm_publisher is not self._publisher:
            unsent += self._swarm_publisher.flush(settings.flush_timeout_s)
        if unsent:  # exit before committing the items: the restart samples them again (same ids)
            raise DeliveryError(
                f"{unsent} groups unacknowledged after the flush (FLUSH_TIMEOUT_S "
                f"{settings.flush_timeout_s} s, STOP_BROKER_WAIT_S once stopping)"
            )
        return shared

    def _observe(self, groups: Sequence[rollout_pb2.RolloutGroup], seconds: float, shared: int) -> None:
        metrics = self._metrics
        metrics.generate_seconds.observe(seconds)
        metrics.round.set(max(g.round for g in groups))
        metrics.groups_shared.inc(shared)
        metrics.work_items.labels("generated").inc(len(groups))
        for group in groups:
            task = group.question.task
            metrics.groups.labels(task).inc()
            rewards = scored_rewards(group)
            if rewards:
                metrics.reward.labels(task).observe(statistics.fmean(rewards))
            failed = sum(c.finish_reason == rollout_pb2.FINISH_REASON_ERROR for c in group.completions)
            metrics.completions_failed.inc(failed)
            metrics.tokens.inc(sum(len(c.token_ids) for c in group.completions))
