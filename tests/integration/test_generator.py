"""The generator against the real broker: published groups, provenance, hot reload, rejected checkpoints."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from sapo import wire
from sapo.backends import SamplingConfig, TransformersBackend
from sapo.convert import question_from_proto
from sapo.identity import NodeKey, Sender, TrustStore
from sapo.identity.keys import write_private
from sapo.kafka.dlq import H_SOURCE as DLQ_SOURCE
from sapo.models import build_tiny_model, load_bundled_tokenizer, tokenizer_fingerprint
from sapo.tasks import EASY_PROFILE, TaskStream, render_prompt
from sapo.topics import TopicNames
from sapo.v1 import rollout_pb2
from tests.integration.generator_helpers import (
    GroupCollector,
    ThreadedGenerator,
    announce,
    create_node_topics,
    generator_settings,
    launch_generator,
    plan_work,
    wait_until,
)
from tests.integration.kafka_helpers import read_topic
from tests.unit.generator.harness import flip_byte, policy_update, write_checkpoint

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KEYS = {"node-a": NodeKey.generate(), "node-b": NodeKey.generate()}
FAILURES = "sapo_generator_weight_load_failures_total"
OBSOLETE = "sapo_generator_work_items_total"
REDERIVE = """
import json, sys
from sapo.tasks import Provenance, rederive
for line in sys.stdin:
    r = rederive(Provenance(**json.loads(line)))
    print(json.dumps([r.task, r.text, r.answer, r.metadata_json]))
"""


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_bundled_tokenizer()


def _launch(bootstrap: str, prefix: str, node_id: str, node_seed: int, log: Path) -> subprocess.Popen[bytes]:
    """node-a's real entrypoint in its own process; its log goes to `log`."""
    key_file = log.with_name(f"{node_id}.key")
    write_private(key_file, KEYS[node_id])
    settings = {
        "NODE_ID": node_id,
        "NODE_SEED": str(node_seed),
        "COMPLETIONS_PER_QUESTION": "3",
        "MAX_NEW_TOKENS": "6",
        "POLICY_CATCHUP_IDLE_S": "1",
        "IDENTITY__PRIVATE_KEY_FILE": str(key_file),
    }
    return launch_generator(bootstrap, prefix, log, settings)


def _rederive_elsewhere(groups: list[rollout_pb2.RolloutGroup]) -> list[list[str]]:
    """Re-derive every group's question from its provenance alone, in a separate Python process."""
    lines = [json.dumps(dataclasses.asdict(question_from_proto(g.question).provenance)) for g in groups]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", REDERIVE],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def _check_group(
    group: rollout_pb2.RolloutGroup, node: str, stream: TaskStream, tokenizer: PreTrainedTokenizerBase
) -> None:
    """Structure, producer, question position in the node's stream, prompt as fed, scored completions."""
    assert wire.validate_rollout_group(group) is None
    assert (group.node_id, group.model_id, group.policy_version) == (node, "tiny:0", 0)
    assert group.tokenizer_fingerprint == tokenizer_fingerprint(tokenizer)
    record = question_from_proto(group.question)
    assert record in [stream.record_at(group.round * 2 + i) for i in range(2)]  # positions r * B + i
    prompt = render_prompt(tokenizer, record)
    assert list(group.prompt_token_ids) == tokenizer.encode(prompt, add_special_tokens=False)
    assert len(group.completions) == 3
    for c in group.completions:
        assert c.finish_reason in (rollout_pb2.FINISH_REASON_STOP, rollout_pb2.FINISH_REASON_LENGTH)
        assert c.HasField("reward") and len(c.logprobs) == len(c.token_ids) > 0


def test_two_nodes_publish_verifiable_groups_with_different_questions(
    kafka_bootstrap: str, topic_prefix: str, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    create_node_topics(kafka_bootstrap, topic_prefix, "node-a", "node-b")
    seeds = {"node-a": 101, "node-b": 202}
    for node in seeds:  # what each node's trainer plans at version 0: async rounds 0 and 1
        plan_work(kafka_bootstrap, topic_prefix, node, 0, 2, round_mode="async", max_ahead=1, rounds=2)
    topics = {node: TopicNames.for_node(node, topic_prefix).rollouts for node in seeds}
    swarm_topic = f"{topic_prefix}.swarm.rollouts"
    collector = GroupCollector(kafka_bootstrap, f"{topic_prefix}.collector", swarm_topic, *topics.values())
    # node-a runs the real entrypoint in its own process; node-b the same wiring in a thread (cheaper).
    log = tmp_path / "node-a.log"
    process = _launch(kafka_bootstrap, topic_prefix, "node-a", seeds["node-a"], log)
    try:
        node_b = generator_settings(
            kafka_bootstrap,
            topic_prefix,
            "node-b",
            node_seed=seeds["node-b"],
            completions_per_question=3,
            identity={"private_key": KEYS["node-b"].pem().decode()},
        )
        with ThreadedGenerator(node_b):
            collector.wait_for(16, timeout_s=90)  # per node: 2 rounds x 2 questions, private + swarm
        collector.close()
        private = {node: collector.on(topics[node]) for node in seeds}
        for node, groups in private.items():
            assert sorted(g.round for g in groups) == [0, 0, 1, 1]
            for group in groups:
                _check_group(group, node, TaskStream(EASY_PROFILE, seeds[node], "train"), tokenizer)

        everything = private["node-a"] + private["node-b"]
        assert sorted(g.group_id for g in collector.on(swarm_topic)) == sorted(g.group_id for g in everything)
        receiver = TrustStore()  # every group, private or shared, is signed by its own node's key
        for node, key in KEYS.items():
            receiver.add(node, key.public, "file")
        for message in collector.records:
            assert message.value is not None
            node = wire.header_str(message.headers, wire.H_NODE)
            verified = receiver.identify(message.headers, message.value, time.time())
            assert verified == Sender(node, KEYS[node].key_id)
        for group, (task, text, answer, metadata_json) in zip(
            everything, _rederive_elsewhere(everything), strict=True
        ):
            q = group.question
            assert (q.task, q.text, q.answer, q.metadata_json) == (task, text, answer, metadata_json)

        provenance = {
            node: {(p.dataset, p.seed, p.index) for p in (g.question.provenance for g in groups)}
            for node, groups in private.items()
        }
        assert provenance["node-a"].isdisjoint(provenance["node-b"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, f"node-a failed:\n{log.read_text()[-3000:]}"
    finally:
        process.kill()  # no-op once it exited


def _regenerate(
    group: rollout_pb2.RolloutGroup, tokenizer: PreTrainedTokenizerBase, seed: int
) -> list[list[int]]:
    """The group's completions as tiny:<seed> samples them from the group's own prompt and sampling record."""
    s = group.sampling
    config = SamplingConfig(
        max_new_tokens=s.max_new_tokens,
        num_samples=len(group.completions),
        temperature=s.temperature,
        top_p=s.top_p,
        stop=tuple(s.stop),
    )
    backend = TransformersBackend(build_tiny_model(tokenizer, seed=seed), tokenizer)
    [samples] = backend.generate([list(group.prompt_token_ids)], config, seeds=[s.seed])
    return [list(sample.token_ids) for sample in samples]


def _tokens(group: rollout_pb2.RolloutGroup) -> list[list[int]]:
    return [list(c.token_ids) for c in group.completions]


def test_a_published_policy_update_swaps_weights_without_restart(
    kafka_bootstrap: str, topic_prefix: str, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    create_node_topics(kafka_bootstrap, topic_prefix, "node-a")
    names = TopicNames.for_node("node-a", topic_prefix)
    collector = GroupCollector(kafka_bootstrap, f"{topic_prefix}.collector", names.rollouts)
    plan_work(kafka_bootstrap, topic_prefix, "node-a", 0)
    with ThreadedGenerator(generator_settings(kafka_bootstrap, topic_prefix)) as gen:
        (first,) = collector.wait_for(1)
        assert (first.round, first.policy_version) == (0, 0)
        assert _tokens(first) == _regenerate(first, tokenizer, seed=0)

        trained = build_tiny_model(tokenizer, seed=1).state_dict()  # same shape, other weights
        written = write_checkpoint(tmp_path, "node-a", 1, trained)
        announce(kafka_bootstrap, names.policy, "node-a", policy_update(written, "node-a", 1))
        plan_work(kafka_bootstrap, topic_prefix, "node-a", 1)
        second = collector.wait_for(2)[1]
        assert (second.round, second.policy_version) == (1, 1)
        # Same prompt and sampling seed: the new weights' output, not the old one's.
        assert _tokens(second) == _regenerate(second, tokenizer, seed=1)
        assert _tokens(second) != _regenerate(second, tokenizer, seed=0)
        assert gen.metric("sapo_generator_policy_version") == 1
        assert gen.metric("sapo_generator_weight_load_seconds_count") == 1
        assert gen.readyz()[0] == 200
    collector.close()


def test_a_corrupt_checkpoint_is_rejected_reported_and_not_loaded(
    kafka_bootstrap: str, topic_prefix: str, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    create_node_topics(kafka_bootstrap, topic_prefix, "node-a")
    names = TopicNames.for_node("node-a", topic_prefix)

    def publish(version: int, *, flip: bool = False, sha256: str | None = None) -> None:
        state = build_tiny_model(tokenizer, seed=version).state_dict()
        written = write_checkpoint(tmp_path, "node-a", version, state)
        if flip:
            flip_byte(written)
        announce(kafka_bootstrap, names.policy, "node-a", policy_update(written, "node-a", version, sha256))

    publish(1)  # announced before start: a (re)starting generator loads it
    plan_work(kafka_bootstrap, topic_prefix, "node-a", 1)
    collector = GroupCollector(kafka_bootstrap, f"{topic_prefix}.collector", names.rollouts)
    with ThreadedGenerator(generator_settings(kafka_bootstrap, topic_prefix)) as gen:
        (first,) = collector.wait_for(1)
        assert (first.round, first.policy_version) == (1, 1)
        assert gen.readyz()[0] == 200

        publish(2, flip=True)
        plan_work(kafka_bootstrap, topic_prefix, "node-a", 2)  # round 2 waits for a v2 that never loads
        wait_until(lambda: gen.metric(FAILURES, {"reason": "digest_mismatch"}) == 1, 30, "rejection of v2")
        # Unready once it holds round 2's items, which wait for the rejected v2 (they may be read
        # after the rejection: a rejected version nothing waits for leaves the generator ready).
        wait_until(lambda: gen.readyz()[0] == 503, 30, "unready while round 2 waits for v2")
        assert "weights_ok" in gen.readyz()[1]
        publish(3, sha256="0" * 64)
        wait_until(lambda: gen.metric(FAILURES, {"reason": "digest_mismatch"}) == 2, 30, "rejection of v3")
        assert gen.metric("sapo_generator_policy_version") == 1
        assert gen.core.backend.model_version == 1
        assert len(collector.groups) == 1  # lockstep: nothing generated with the wrong version

        publish(4)
        plan_work(kafka_bootstrap, topic_prefix, "node-a", 4)
        second = collector.wait_for(2)[1]
        assert (second.round, second.policy_version) == (4, 4)
        wait_until(lambda: gen.metric(OBSOLETE, {"outcome": "obsolete"}) == 1, 30, "round 2 dropped")
        assert gen.readyz()[0] == 200
        assert gen.metric("sapo_generator_policy_version") == 4
    collector.close()


def test_a_restarted_generator_dead_letters_only_the_refused_updates_that_arrive_after_it_starts(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Every start reads the compacted policy topic again: a refused update read before is counted, and
    dead-lettered only by the generator that read it as it arrived (one there before any generator ran
    is dead-lettered by none)."""
    create_node_topics(kafka_bootstrap, topic_prefix, "node-a")
    names = TopicNames.for_node("node-a", topic_prefix)
    rejected, dead = "sapo_generator_messages_rejected_total", "sapo_generator_messages_dead_lettered_total"
    foreign = policy_update(write_checkpoint(tmp_path, "node-b", 1, {}), "node-b", 1)
    announce(kafka_bootstrap, names.policy, "node-a", foreign)  # before any generator
    settings = generator_settings(kafka_bootstrap, topic_prefix, policy_catchup_idle_s=0.5)
    with ThreadedGenerator(settings) as first:
        wait_until(lambda: first.metric(rejected, {"reason": "foreign_node"}) == 1, 30, "the first read")
        announce(kafka_bootstrap, names.policy, "node-a", b"\xff\xff")
        wait_until(lambda: first.metric(dead, {"reason": "undecodable"}) == 1, 30, "a dead letter")
    with ThreadedGenerator(settings) as second:
        wait_until(lambda: second.metric(rejected, {"reason": "undecodable"}) == 1, 30, "the second read")
        announce(kafka_bootstrap, names.policy, "node-a", b"\xfe")
        wait_until(lambda: second.metric(rejected, {"reason": "undecodable"}) == 2, 30, "a new update")
        assert second.metric(rejected, {"reason": "foreign_node"}) == 1
        assert second.metric(dead, {"reason": "foreign_node"}) == 0
        assert second.metric(dead, {"reason": "undecodable"}) == 1
    letters = read_topic(kafka_bootstrap, names.dlq)
    assert [(r.value, r.headers[DLQ_SOURCE]) for r in letters] == [
        (b"\xff\xff", f"{names.policy}/0/1".encode()),
        (b"\xfe", f"{names.policy}/0/2".encode()),
    ]
