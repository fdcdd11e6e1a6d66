"""A heterogeneous swarm through real processes: two nodes whose models have different tokenizers
(the bundled SmolLM2 one and the project's BPE one) train on each other's groups.

Untrained tiny models never close the answer tag, so all their groups score 0, carry no signal and are
dropped by every sampler: no external group would ever reach a batch. The nodes are therefore warm
models after a third of the default SFT (100 steps: ~95% of answers tagged, reward ~0.1, about two
thirds of the groups with signal; bench/calibrate_warm.py). They are built before the swarm starts,
into sapo's cache (about 45 s for both on an idle core, once), where the services find them.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sapo.kafka import Disposition, Record
from sapo.models import project_tokenizer, tokenizer_fingerprint, warm_model_dir
from sapo.swarm.history import read_rows
from sapo.swarm.manifest import parse_manifest
from sapo.swarm.run import run_swarm
from sapo.topics import TopicNames
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import decode
from tests.integration.kafka_helpers import make_loop

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
ROUNDS = 2
MODELS = {"node-a": "warm:1:64x2:100", "node-b": "warm-bpe:2:64x2:100"}
PEER = {"node-a": "node-b", "node-b": "node-a"}


def _messages(bootstrap: str, topic: str, count: int) -> list[bytes]:
    out: list[bytes] = []

    def collect(record: Record) -> Disposition:
        out.append(record.value or b"")
        return Disposition.DONE

    loop, _, _ = make_loop(bootstrap, f"{topic}.check", [topic], collect)
    loop.run(max_records=count, idle_timeout_s=20)
    return out


def test_two_tokenizer_families_train_on_each_others_groups(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    fingerprints = {node: tokenizer_fingerprint(project_tokenizer(ref)) for node, ref in MODELS.items()}
    assert fingerprints["node-a"] != fingerprints["node-b"]
    for ref in MODELS.values():
        warm_model_dir(ref)
    manifest = parse_manifest(
        {
            "name": "it-hetero",
            "bootstrap": kafka_bootstrap,
            "topic_prefix": topic_prefix,
            "defaults": {
                "questions_per_round": 4,
                "completions_per_question": 4,
                "local_groups": 2,
                "external_groups": 2,
                "rounds": ROUNDS,
                "max_new_tokens": 16,
                "learning_rate": 1e-3,
                "sampler": {"lockstep_timeout_s": 120},  # only waits if a peer is missing
            },
            "nodes": [
                {"id": "node-a", "seed": 1, "model": MODELS["node-a"]},
                {"id": "node-b", "seed": 2, "model": MODELS["node-b"]},
            ],
        }
    )
    run_dir = tmp_path / "run"
    out = io.StringIO()
    assert run_swarm(manifest, run_dir, refresh_s=0.5, out=out) == 0, out.getvalue()

    for node, peer in PEER.items():
        topics = TopicNames.for_node(node, topic_prefix)
        # Every version was announced (the recorder writes one step row per PolicyUpdate) and, in
        # lock-step, round r was sampled with version r: each announced version was loaded.
        steps = read_rows(run_dir / "steps" / f"{node}.jsonl")
        assert [s["version"] for s in steps] == list(range(1, ROUNDS + 1))
        groups = [
            decode(rollout_pb2.RolloutGroup, v, 1 << 24)
            for v in _messages(kafka_bootstrap, topics.rollouts, ROUNDS * 4)
        ]
        assert sorted((g.round, g.policy_version) for g in groups) == [
            (r, r) for r in range(ROUNDS) for _ in range(4)
        ]
        assert {g.tokenizer_fingerprint for g in groups} == {fingerprints[node]}

        batches = [
            decode(batch_pb2.TrainingBatch, v, 1 << 24)
            for v in _messages(kafka_bootstrap, topics.batches, ROUNDS)
        ]
        assert sorted(b.batch_id for b in batches) == [f"{node}/{i}" for i in range(ROUNDS)]
        external = [
            bg.group for b in batches for bg in b.groups if bg.source == batch_pb2.GROUP_SOURCE_EXTERNAL
        ]
        # The peer's groups, generated with the other tokenizer, made it into this node's batches...
        assert external, f"{node} trained on no external group"
        assert {(g.node_id, g.tokenizer_fingerprint) for g in external} == {(peer, fingerprints[peer])}
        # ...and were trained on: a step whose batch held them trained on completion tokens.
        trained = {s["batch_id"] for s in steps if s["completion_tokens"] > 0}
        assert {
            b.batch_id
            for b in batches
            if any(bg.source == batch_pb2.GROUP_SOURCE_EXTERNAL for bg in b.groups)
        } <= trained
