"""Records a running swarm from its topics: the per-step and per-round history of the run.

Each `PolicyUpdate` carries the metrics of the step that produced it, and each node's rollout topic
carries every group it generated with its local rewards, so following those topics live gives the
reward curves (`sapo.swarm.history`) without asking any service for anything. Reading them live
(rather than at the end) keeps the record complete on clusters that compact or expire those topics.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from sapo.kafka import ConsumerLoop, Disposition, KafkaConsumerClient, Record, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, append_row, round_row, step_row
from sapo.v1 import policy_pb2, rollout_pb2
from sapo.wire import decode

MAX_GROUP_BYTES = 1 << 26


class SwarmRecorder:
    """Follows the policy topics (one step row per new version) and the nodes' rollout topics (one
    round row once a node's round is complete, i.e. holds `questions_per_round` groups)."""

    def __init__(
        self,
        consumer_config: dict[str, str],
        policy_topics: list[str],
        rollout_topics: list[str],
        run_dir: Path,
        *,
        group: str,
        questions_per_round: Mapping[str, int],
    ) -> None:
        self.run_dir = run_dir
        self.latest: dict[str, int] = {}
        self._policy_topics = set(policy_topics)
        self._per_round = dict(questions_per_round)
        self._open_rounds: dict[tuple[str, int], dict[str, rollout_pb2.RolloutGroup]] = defaultdict(dict)
        self._closed_rounds: set[tuple[str, int]] = set()
        self._loop = ConsumerLoop(
            KafkaConsumerClient(consumer_config, group),
            [*policy_topics, *rollout_topics],
            self._handle,
            stop=StopFlag(),
            metrics=TransportMetrics(CollectorRegistry(), "swarm"),
            poll_timeout_s=0.0,
        )
        self._loop.open()

    def _handle(self, record: Record) -> Disposition:
        if record.topic in self._policy_topics:
            self._on_update(decode(policy_pb2.PolicyUpdate, record.value, 1 << 20))
        else:
            self._on_group(decode(rollout_pb2.RolloutGroup, record.value, MAX_GROUP_BYTES))
        return Disposition.DONE

    def _on_update(self, update: policy_pb2.PolicyUpdate) -> None:
        if update.version <= self.latest.get(update.node_id, -1):
            return  # a re-announcement after a restart
        self.latest[update.node_id] = update.version
        if update.version > 0:
            created = update.created_at.seconds + update.created_at.nanos / 1e9
            row = step_row(update.node_id, update.version, update.batch_id, update.metrics, created)
            append_row(self.run_dir / STEPS_DIR / f"{update.node_id}.jsonl", row)

    def _on_group(self, group: rollout_pb2.RolloutGroup) -> None:
        key = (group.node_id, group.round)
        if key in self._closed_rounds:
            return  # a question of the round sampled again (a replica died): the first one counts
        groups = self._open_rounds[key]
        groups.setdefault(group.group_id, group)  # the same item twice is the same group id
        if len(groups) >= self._per_round.get(group.node_id, 1):
            self._close_round(key)

    def _close_round(self, key: tuple[str, int]) -> None:
        groups = self._open_rounds.pop(key)
        self._closed_rounds.add(key)
        ordered = sorted(groups.values(), key=lambda g: g.position)
        append_row(self.run_dir / ROUNDS_DIR / f"{key[0]}.jsonl", round_row(ordered))

    def drain(self, max_records: int = 1000) -> None:
        """Handle whatever has arrived, without blocking."""
        for _ in range(max_records):
            if not self._loop.step(0.0):
                return

    def close(self) -> None:
        """Stop following; rounds still incomplete (a generator stopped mid-round) are written as
        they are, their row saying how many groups they hold."""
        for key in sorted(self._open_rounds):
            self._close_round(key)
        self._loop.close()
