"""The fault-injection accounting catches what it exists to catch: a lost group, a group or batch
trained twice, a version announced twice with different content, a missing version."""

from __future__ import annotations

import pytest

from sapo.v1 import batch_pb2, policy_pb2, rollout_pb2
from tests.faults.ledger import DeadLetter, node_ledger, parse_dead_letter

pytestmark = pytest.mark.unit
NODE = "node-a"
LOCAL, EXTERNAL = batch_pb2.GROUP_SOURCE_LOCAL, batch_pb2.GROUP_SOURCE_EXTERNAL


def group(round_: int, position: int, rewards: tuple[float, ...] = (0.0, 1.0)) -> rollout_pb2.RolloutGroup:
    g = rollout_pb2.RolloutGroup(group_id=f"{NODE}/{round_}/{position}", round=round_, position=position)
    for reward in rewards:
        g.completions.add(reward=reward)
    return g


def batch(sequence: int, *members: tuple[rollout_pb2.RolloutGroup, int]) -> batch_pb2.TrainingBatch:
    b = batch_pb2.TrainingBatch(batch_id=f"{NODE}/{sequence}", sequence=sequence, round=sequence)
    for g, source in members:
        b.groups.add(group=g, source=source)
    return b


def update(version: int, batch_id: str, sha: str = "") -> policy_pb2.PolicyUpdate:
    return policy_pb2.PolicyUpdate(version=version, batch_id=batch_id, manifest_sha256=sha or f"sha{version}")


def test_a_clean_run_accounts_for_every_group_and_counts_repeats() -> None:
    g = [group(0, 0), group(0, 1), group(1, 0), group(1, 1, rewards=(1.0, 1.0))]
    batches = [batch(0, (g[0], LOCAL), (g[1], LOCAL)), batch(1, (g[2], LOCAL))]
    updates = [update(0, ""), update(1, "node-a/0"), update(2, "node-a/1"), update(2, "node-a/1")]
    ledger = node_ledger(NODE, [*g, g[0]], [*batches, batches[1]], updates, [])
    assert (ledger.lost, ledger.trained_twice, ledger.problems) == ([], [], [])
    assert (ledger.rollout_records, ledger.groups_generated, ledger.groups_trained) == (5, 4, 3)
    assert ledger.groups_without_signal == 1  # the sampler drops it by rule
    assert (ledger.batch_records, ledger.batches_emitted, ledger.batches_trained, ledger.last_version) == (
        3,
        2,
        2,
        2,
    )


def test_a_group_in_no_trained_batch_is_lost_unless_dead_lettered() -> None:
    g = [group(0, 0), group(0, 1), group(0, 2)]
    dead = [DeadLetter("malformed", "rollouts", g[2].group_id, None)]
    ledger = node_ledger(NODE, g, [batch(0, (g[0], LOCAL))], [update(1, "node-a/0")], dead)
    assert ledger.lost == [f"group {g[1].group_id} (round 0, position 1)"]
    assert ledger.groups_dead_lettered == {"malformed": 1}


def test_a_zero_advantage_group_is_lost_when_the_node_keeps_them() -> None:
    flat = group(0, 0, rewards=(1.0, 1.0))
    ledger = node_ledger(NODE, [flat], [], [], [], keeps_zero_advantage=True)
    assert len(ledger.lost) == 1


def test_a_group_in_two_trained_batches_and_a_batch_under_two_versions_are_trained_twice() -> None:
    g = group(0, 0)
    batches = [batch(0, (g, LOCAL)), batch(1, (g, LOCAL))]
    ledger = node_ledger(NODE, [g], batches, [update(1, "node-a/0"), update(2, "node-a/1")], [])
    assert ledger.trained_twice == [f"group {g.group_id} in 2 trained batches"]
    ledger = node_ledger(NODE, [g], batches[:1], [update(1, "node-a/0"), update(2, "node-a/0")], [])
    assert ledger.trained_twice == ["batch node-a/0 trained as 2 versions"]


def test_conflicting_announcements_missing_versions_and_unknown_batches_are_problems() -> None:
    g = group(0, 0)
    updates = [update(1, "node-a/0", "a"), update(1, "node-a/0", "b"), update(3, "node-a/9")]
    ledger = node_ledger(NODE, [g], [batch(0, (g, LOCAL))], updates, [])
    assert any("version 1 announced as" in p for p in ledger.problems)
    assert "versions never announced: [2]" in ledger.problems
    assert "trained batch node-a/9 is not on the batches topic" in ledger.problems


def test_two_records_of_one_batch_id_with_different_groups_are_a_problem() -> None:
    a, b = group(0, 0), group(0, 1)
    ledger = node_ledger(
        NODE, [a, b], [batch(0, (a, LOCAL)), batch(0, (b, LOCAL))], [update(1, "node-a/0")], []
    )
    assert ledger.problems == ["two records of batch node-a/0 hold different groups"]


def test_external_groups_are_counted_but_never_owed_to_the_node() -> None:
    own, peer = group(0, 0), rollout_pb2.RolloutGroup(group_id="node-b/0/0")
    ledger = node_ledger(NODE, [own], [batch(0, (own, LOCAL), (peer, EXTERNAL))], [update(1, "node-a/0")], [])
    assert (ledger.groups_trained, ledger.external_groups_trained, ledger.lost) == (1, 1, [])


def test_dead_letters_name_their_group_or_batch_even_when_hostile() -> None:
    g = group(0, 0)
    assert parse_dead_letter(
        "x", "t.rollouts", g.SerializeToString(), batches_topic="t.batches"
    ).group_id == (g.group_id)
    quarantined = batch(3).SerializeToString()
    assert (
        parse_dead_letter("poison", "t.batches", quarantined, batches_topic="t.batches").batch_id
        == "node-a/3"
    )
    garbage = parse_dead_letter("malformed", "t.rollouts", b"\xff\xff\xff", batches_topic="t.batches")
    assert (garbage.reason, garbage.group_id, garbage.batch_id) == ("malformed", None, None)
