"""Warm start through the real sampler process on the real broker: a late node trains on the swarm
topic's history (screened as live groups), joins the swarm's lock-step round, and a restart does not
warm-start again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sapo.kafka import KafkaPublisher
from tests.integration.raw_producer import produce_raw
from tests.integration.test_sampler import NODE, ROOT, TopicReader, _get, _sampler_env, _send, _topics
from tests.unit.sampler.builders import encoded, questions, real_group

pytestmark = pytest.mark.integration
PEERS = ("peer-1", "peer-2")


def _metric(text: str, name: str) -> float:
    """The value of one sample line of the Prometheus text exposition."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[-1])


def test_a_late_node_trains_on_the_history_then_joins_the_swarm_round(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    topics = _topics(kafka_bootstrap, topic_prefix)
    records = iter(questions(node_seed=41, count=32))
    now = time.time()
    history = {  # the swarm ran rounds 0..2 and is in round 3
        (peer, round_): real_group(next(records), peer, round_=round_)
        for peer in PEERS
        for round_ in range(4)
    }
    spare = real_group(next(records), "peer-1", round_=1)  # a third group of round 1: no room for it
    rejected = [
        real_group(next(records), NODE, round_=1),  # its own groups on the swarm topic
        real_group(next(records), "peer-2", (True, True, True, True), round_=2),  # no signal
        real_group(next(records), "peer-1", round_=2, completed_s=now - 1000),  # older than MAX_AGE_S
    ]
    pub = KafkaPublisher({"bootstrap.servers": kafka_bootstrap})
    for group in [*history.values(), spare, *rejected]:
        _send(pub, topics.swarm_rollouts, group)
    assert pub.flush(10) == 0
    # A header name that is not UTF-8 (the live loop refuses the record as bad_header), on a good group.
    hostile = real_group(next(records), "peer-1", round_=2)
    value, headers = encoded(hostile)
    hostile_headers = [(b"\xff\xfe", b"1"), *((name.encode(), v) for name, v in headers)]
    produce_raw(kafka_bootstrap, topics.swarm_rollouts, hostile.group_id.encode(), value, hostile_headers)

    env = _sampler_env(kafka_bootstrap, topic_prefix) | {
        f"SAPO_SAMPLER_{k}": v
        for k, v in {
            "ROUND_MODE": "lockstep",
            "QUESTIONS_PER_ROUND": "1",
            "LOCAL_GROUPS": "1",
            "EXTERNAL_GROUPS": "1",
            "MAX_PER_SOURCE": "1",
            "EXPECTED_PEERS": "2",
            "LOCKSTEP_TIMEOUT_S": "2",
            "WARM_START__ENABLED": "true",
            "WARM_START__MAX_AGE_S": "600",
        }.items()
    }
    cmd = [sys.executable, "-m", "services.sampler.main"]
    log_path = tmp_path / "sampler.log"
    reader = TopicReader(kafka_bootstrap, topics.batches)
    with log_path.open("w") as log:
        first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            warm = reader.batches(3, timeout_s=60)
            metrics = _get(log_path, "/metrics")
            _send(pub, topics.rollouts, real_group(next(records), NODE, round_=3, policy_version=3))
            pub.flush(10)
            joined = reader.batches(4, timeout_s=30)
        finally:
            first.send_signal(signal.SIGTERM)
            code = first.wait(20)
        assert code == 0, log_path.read_text()[-3000:]
        second = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            _send(pub, topics.rollouts, real_group(next(records), NODE, round_=4, policy_version=4))
            _send(pub, topics.swarm_rollouts, real_group(next(records), "peer-2", round_=4))
            pub.flush(10)
            after_restart = reader.batches(5, timeout_s=60)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(20)
    reader.close()
    text = log_path.read_text()

    lined_up = [(b.sequence, b.round, b.warm_start) for b in warm[:3]]
    assert lined_up == [(r, r, True) for r in range(3)], text[-3000:]
    for round_, batch in enumerate(warm[:3]):  # one group of each peer's round, re-scored here
        assert {bg.group.group_id for bg in batch.groups} <= {history[p, round_].group_id for p in PEERS} | {
            spare.group_id
        }
        assert len(batch.groups) == 2
        assert all(len(bg.rewards) == 4 and bg.advantages for bg in batch.groups)
    live = joined[3]
    assert (live.sequence, live.round, live.warm_start) == (3, 3, False)
    senders = sorted(bg.group.node_id for bg in live.groups)  # its own round 3 and a peer's
    assert senders[0] == NODE and senders[1] in PEERS and len(senders) == 2
    resumed = after_restart[4]
    assert (resumed.sequence, resumed.round, resumed.warm_start) == (4, 4, False), text[-3000:]
    used = [bg.group.group_id for b in after_restart for bg in b.groups]
    assert len(used) == len(set(used)), "a history group was trained twice"
    assert text.count("warm start: reading") == 1, "the restart warm-started again"

    assert _metric(metrics, "sapo_sampler_warm_start_batches_total") == 3
    assert _metric(metrics, "sapo_sampler_warm_start_groups_used_total") == 6
    assert _metric(metrics, "sapo_sampler_warm_start_groups_read_total") == 13
    for reason, count in {"own_node": 1, "no_signal": 1, "too_old": 1, "unused": 3, "bad_header": 1}.items():
        assert (
            _metric(metrics, f'sapo_sampler_warm_start_groups_rejected_total{{reason="{reason}"}}') == count
        )
