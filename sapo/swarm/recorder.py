"""Records every node's policy announcements while a swarm runs: the per-step history of a run.

Each `PolicyUpdate` carries the metrics of the step that produced it, so following the policy
topics live gives the per-round reward curves without asking the trainers for anything else.
Reading them live (rather than at the end) keeps the record complete on clusters that compact
the policy topics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from sapo.kafka import ConsumerLoop, Disposition, KafkaConsumerClient, Record, TransportMetrics
from sapo.lifecycle import StopFlag
from sapo.v1 import policy_pb2
from sapo.wire import decode


def update_row(update: policy_pb2.PolicyUpdate) -> dict[str, Any]:
    m = update.metrics
    return {
        "node": update.node_id,
        "version": update.version,
        "batch_id": update.batch_id,
        "loss": m.loss,
        "reward_mean": m.reward_mean,
        "local_reward_mean": m.local_reward_mean,
        "clip_fraction_low": m.clip_fraction_low,
        "clip_fraction_high": m.clip_fraction_high,
        "grad_norm": m.grad_norm,
        "entropy": m.entropy,
        "completion_tokens": m.completion_tokens,
        "step_seconds": m.step_seconds,
        "created_at": update.created_at.seconds + update.created_at.nanos / 1e9,
    }


class PolicyRecorder:
    """Follows the given policy topics and appends one JSON line per new version to steps/<node>.jsonl."""

    def __init__(self, consumer_config: dict[str, str], topics: list[str], out_dir: Path, group: str) -> None:
        self.out_dir = out_dir
        self.latest: dict[str, int] = {}
        self._loop = ConsumerLoop(
            KafkaConsumerClient(consumer_config, group),
            topics,
            self._handle,
            stop=StopFlag(),
            metrics=TransportMetrics(CollectorRegistry(), "swarm"),
            poll_timeout_s=0.0,
        )
        self._loop.open()

    def _handle(self, record: Record) -> Disposition:
        update = decode(policy_pb2.PolicyUpdate, record.value, 1 << 20)
        if update.version > self.latest.get(update.node_id, -1):
            self.latest[update.node_id] = update.version
            if update.version > 0:
                with (self.out_dir / f"{update.node_id}.jsonl").open("a") as out:
                    out.write(json.dumps(update_row(update)) + "\n")
        return Disposition.DONE

    def drain(self, max_records: int = 1000) -> None:
        """Handle whatever has arrived, without blocking."""
        for _ in range(max_records):
            if not self._loop.step(0.0):
                return

    def close(self) -> None:
        self._loop.close()
