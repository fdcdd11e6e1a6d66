"""The generator service: rounds of B questions x L completions from the current policy, published as groups.

Each round: wait until the loaded policy may generate it (`sapo.generator.pacing`), draw the round's
questions from the node's train stream, sample all B x L completions in one backend call, score them
locally, publish every group to the node's rollout topic and the shared subset to the swarm topic,
flush. Between rounds (and while waiting) the policy follower applies newly announced weights.

Delivery semantics:
- Stateless: nothing is stored locally. On start the generator reads the compacted policy topic from
  the beginning, loads the newest version and resumes at round = that version, so a restart continues
  where the node is. The round's questions (stream positions round * B + i) and sampling seed are
  derived from (node seed, round), so a regenerated round asks the same questions.
- Groups get a fresh UUID every time they are generated. Downstream dedupe by group id absorbs
  redelivery of the same message; a regenerated round is new data, not a duplicate.
- At-least-once publish: the idempotent producer (acks=all) retries, and each round ends with a
  bounded flush before the next one starts. A round in flight when the process dies is generated again
  after the restart (lock-step resumes at the announced version, which is that round; async resumes up
  to max_ahead rounds earlier), so nothing is lost, but a sampler may see a round's questions twice
  and must bound what it takes per round.
- A group's policy_version is the version loaded when its batch started; weights are never swapped
  inside a batch, so one group never mixes versions.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Self

from sapo.backends import GenerationBackend
from sapo.generator import generate_round
from sapo.generator.settings import GeneratorSettings
from sapo.generator.sharing import scored_rewards
from sapo.identity import IdentityError
from sapo.kafka import Publisher
from sapo.lifecycle import StopFlag
from sapo.node.build import build_backend, model_shapes, round_source
from sapo.node.metrics import GeneratorMetrics
from sapo.node.policy import WEIGHTS_OK, PolicyFollower
from sapo.ops import Health
from sapo.runtime import Runtime
from sapo.settings import ConfigError
from sapo.tasks import TaskStream
from sapo.topics import TopicNames
from sapo.v1 import rollout_pb2
from sapo.wire import HeaderSigner, rollout_headers

log = logging.getLogger(__name__)

MODEL_LOADED = "model_loaded"
_WAIT_POLL_S = 0.5
_WARN_EVERY_S = 60.0


class GeneratorService:
    """Runs rounds until stopped, `until()` holds, or the round limit is reached."""

    def __init__(
        self,
        settings: GeneratorSettings,
        backend: GenerationBackend,
        follower: PolicyFollower,
        *,
        publisher: Publisher,
        swarm_publisher: Publisher,
        topics: TopicNames,
        metrics: GeneratorMetrics,
        health: Health,
        stop: StopFlag,
        signer: HeaderSigner | None = None,
    ) -> None:
        self._settings = settings
        self._backend = backend
        self._follower = follower
        self._publisher = publisher
        self._swarm_publisher = swarm_publisher
        self._topics = topics
        self._metrics = metrics
        self._health = health
        self._stop = stop
        self._pacing = settings.pacing()
        self._source = round_source(settings, backend.tokenizer)
        self._stream = TaskStream(settings.task_profile(), self._source.node_seed, "train")
        self._signer = signer
        self.round = 0
        """The next round to generate."""

    @classmethod
    def from_runtime(cls, settings: GeneratorSettings, runtime: Runtime) -> Self:
        """Wire the service to the process's runtime: model, policy follower, publishers, metrics, health."""
        runtime.health.require(MODEL_LOADED, WEIGHTS_OK)
        runtime.health.set_max_silence(settings.liveness_timeout_s)
        try:  # before the model loads: a missing key fails at once
            signer = settings.identity.signer()
        except IdentityError as exc:
            raise ConfigError(f"SAPO_GENERATOR_IDENTITY: {exc}") from None
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
            max_message_bytes=settings.max_message_bytes,
            catchup_idle_s=settings.policy_catchup_idle_s,
            reload=settings.reload_policy(),
            dead_letters=runtime.dead_letters,
            shapes=model_shapes(backend),
        )
        return cls(
            settings,
            backend,
            follower,
            publisher=runtime.publisher,
            swarm_publisher=runtime.swarm_publisher,
            topics=runtime.topics,
            metrics=metrics,
            health=runtime.health,
            stop=runtime.stop,
            signer=signer,
        )

    @property
    def backend(self) -> GenerationBackend:
        """The sampling backend (its `model_version` is the loaded policy version)."""
        return self._backend

    def run(self, until: Callable[[], bool] | None = None) -> int:
        """Catch up with the policy topic, then generate rounds; returns how many were generated."""
        done = 0
        self._follower.open()
        try:
            if not self._follower.catch_up():
                return 0
            self.round = self._follower.announced
            while (round_ := self._await_policy(self.round, until)) is not None:
                self.run_round(round_)
                self.round = round_ + 1
                done += 1
        finally:
            self._follower.close()
        log.info("generator stopped after %d rounds (next round %d)", done, self.round)
        return done

    def close(self) -> None:
        """Leave the policy topic's consumer group (`run` already did unless it was never started)."""
        self._follower.close()

    def _halted(self, round_: int, until: Callable[[], bool] | None) -> bool:
        return self._stop.is_set() or self._pacing.finished(round_) or (until is not None and until())

    def _await_policy(self, round_: int, until: Callable[[], bool] | None) -> int | None:
        """The round to generate next once the loaded policy allows it; None when the loop should end."""
        self._follower.poll(0.0)
        warned = time.monotonic()
        while True:
            self._health.beat()
            round_ = self._pacing.align(round_, self._follower.loaded)
            if self._halted(round_, until):
                return None
            if self._pacing.may_generate(round_, self._follower.loaded):
                return round_
            if time.monotonic() - warned > _WARN_EVERY_S:
                warned = time.monotonic()
                log.info(
                    "round %d waits for policy v%d (loaded v%d, announced v%d)",
                    round_,
                    self._pacing.required_version(round_),
                    self._follower.loaded,
                    self._follower.announced,
                )
            self._follower.poll(_WAIT_POLL_S)

    def run_round(self, round_: int) -> list[rollout_pb2.RolloutGroup]:
        """Generate, score, publish and flush one round with the currently loaded weights."""
        version = self._backend.model_version
        generated = generate_round(self._backend, self._stream, self._source, round_, version)
        groups, seconds = generated.groups, generated.generate_seconds
        shared = self._publish(groups)
        self._observe(round_, groups, seconds, shared)
        log.info(
            "round %d: %d groups (%d shared) with v%d in %.1fs", round_, len(groups), shared, version, seconds
        )
        return groups

    def _publish(self, groups: Sequence[rollout_pb2.RolloutGroup]) -> int:
        """Send every group to the private topic and the shared ones to the swarm; flush both."""
        settings = self._settings
        shared = 0
        for group in groups:
            value = group.SerializeToString()
            headers = rollout_headers(group, value, self._signer)
            key = group.group_id.encode()
            self._publisher.send(self._topics.rollouts, key, value, headers)
            if settings.shares(group):
                self._swarm_publisher.send(self._topics.swarm_rollouts, key, value, headers)
                shared += 1
        self._publisher.flush(settings.flush_timeout_s)
        if self._swarm_publisher is not self._publisher:
            self._swarm_publisher.flush(settings.flush_timeout_s)
        return shared

    def _observe(
        self, round_: int, groups: Sequence[rollout_pb2.RolloutGroup], seconds: float, shared: int
    ) -> None:
        metrics = self._metrics
        metrics.generate_seconds.observe(seconds)
        metrics.round.set(round_)
        metrics.groups_shared.inc(shared)
        for group in groups:
            task = group.question.task
            metrics.groups.labels(task).inc()
            rewards = scored_rewards(group)
            if rewards:
                metrics.reward.labels(task).observe(statistics.fmean(rewards))
            failed = sum(c.finish_reason == rollout_pb2.FINISH_REASON_ERROR for c in group.completions)
            metrics.completions_failed.inc(failed)
            metrics.tokens.inc(sum(len(c.token_ids) for c in group.completions))
