"""The in-process swarm: the run record, who trains on whose groups, determinism, final checkpoints.

A random tiny model never closes an answer tag, so every reward is 0 and nothing would be trained.
`RightWhenEven` wraps the real backend (the node's own model still samples every completion) and
rewrites the text of each completion whose first sampled token id is even into the question's right
answer: rewards then depend on what the model sampled, most groups carry signal, and steps happen.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.backends import Sample, SamplingConfig, WeightsSource
from sapo.checkpoints import CheckpointStore, load_weights, read_manifest
from sapo.settings import ConfigError
from sapo.swarm.history import read_rows
from sapo.swarm.inprocess import InProcessSwarm, NodeRound, run_inprocess, shared_backend
from sapo.swarm.manifest import SwarmManifest, parse_manifest, resolve
from sapo.tasks import TaskStream, get_profile
from sapo.trainer import Trainer
from sapo.v1 import batch_pb2

pytestmark = pytest.mark.unit
ROUNDS = 2
B = 2
LOCAL = batch_pb2.GROUP_SOURCE_LOCAL
EXTERNAL = batch_pb2.GROUP_SOURCE_EXTERNAL


def manifest(**defaults: object) -> SwarmManifest:
    """node-a shares and takes 1 local + 2 external; node-b shares but trains on 2 local only (I/J
    2/0); node-c shares nothing and takes 1 + 2."""
    return parse_manifest(
        {
            "name": "t",
            "defaults": {
                "model": "tiny:1",
                "profile": "easy",
                "questions_per_round": B,
                "completions_per_question": 4,
                "local_groups": 1,
                "external_groups": 2,
                "rounds": ROUNDS,
                "max_new_tokens": 4,
                "learning_rate": 1e-3,
                **defaults,
            },
            "nodes": [
                {"id": "node-a", "seed": 1},
                {"id": "node-b", "seed": 2, "model": "tiny:2", "local_groups": 2, "external_groups": 0},
                {"id": "node-c", "seed": 3, "sharing": "none"},
            ],
        }
    )


class RightWhenEven:
    """A GenerationBackend over the real one; see the module docstring."""

    def __init__(self, trainer: Trainer, node_seed: int) -> None:
        self.inner = shared_backend(trainer)
        self.stream = TaskStream(get_profile("easy"), node_seed, "train")
        self.calls = 0  # one generate call per round

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.inner.tokenizer

    @property
    def model_version(self) -> int:
        return self.inner.model_version

    def load_weights(self, weights: WeightsSource, version: int, *, owned: bool = False) -> None:
        raise AssertionError("the in-process swarm never reloads weights")

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingConfig, seeds: Sequence[int] | None = None
    ) -> list[list[Sample]]:
        out = self.inner.generate(prompts, params, seeds)
        answers = [self.stream.record_at(self.calls * B + i).answer for i in range(len(prompts))]
        self.calls += 1
        return [
            [
                Sample(f"{answer}</answer>", s.token_ids, s.logprobs, s.finish_reason)
                if s.token_ids and s.token_ids[0] % 2 == 0
                else s
                for s in samples
            ]
            for answer, samples in zip(answers, out, strict=True)
        ]


def run_rounds(m: SwarmManifest, run_dir: Path) -> list[list[NodeRound]]:
    seeds = {n.id: n.seed or 0 for n in m.nodes}
    swarm = InProcessSwarm(m, run_dir, make_backend=lambda t: RightWhenEven(t, seeds[t.node_id]))
    swarm.start()
    done = [swarm.run_round(r) for r in range(swarm.rounds)]
    swarm.finish()
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, list[list[NodeRound]]]]:
    """The same manifest run twice, in two run directories."""
    m = manifest()
    dirs = [tmp_path_factory.mktemp("run1"), tmp_path_factory.mktemp("run2")]
    return [(d, run_rounds(m, d)) for d in dirs]


def test_the_record_has_one_step_and_one_round_row_per_round_per_node(
    runs: list[tuple[Path, list[list[NodeRound]]]],
) -> None:
    run_dir, _ = runs[0]
    assert (run_dir / "manifest.json").exists()
    for node in ("node-a", "node-b", "node-c"):
        steps = read_rows(run_dir / "steps" / f"{node}.jsonl")
        assert [s["version"] for s in steps] == list(range(1, ROUNDS + 1))
        assert [s["batch_id"] for s in steps] == [f"{node}/{i}" for i in range(ROUNDS)]
        created = [s["created_at"] for s in steps]
        assert created == sorted(created) and created[0] > 1.6e9  # wall clock, not a counter
        rounds = read_rows(run_dir / "rounds" / f"{node}.jsonl")
        # Lock-step: round r is sampled with the weights of version r.
        assert [(r["round"], r["policy_version"], r["groups"]) for r in rounds] == [
            (r, r, B) for r in range(ROUNDS)
        ]


def test_nodes_train_on_their_own_groups_and_on_shared_groups_of_others_only(
    runs: list[tuple[Path, list[list[NodeRound]]]],
) -> None:
    _, done = runs[0]
    externals: dict[str, set[str]] = {"node-a": set(), "node-b": set(), "node-c": set()}
    for node_rounds in done:
        assert [r.node_id for r in node_rounds] == ["node-a", "node-b", "node-c"]
        for r in node_rounds:
            assert r.waited_s == 0  # every expected peer shared something: no lock-step timeout
            for bg in r.batch.groups:
                if bg.source == LOCAL:
                    assert bg.group.node_id == r.node_id and bg.group.round == r.batch.round
                else:
                    externals[r.node_id].add(bg.group.node_id)
    # node-c shares nothing: node-a can only get node-b's groups; node-b (I/J 2/0) gets none.
    assert externals == {"node-a": {"node-b"}, "node-b": set(), "node-c": {"node-a", "node-b"}}
    shared = {r.node_id: r.shared for node_rounds in done for r in node_rounds}
    assert shared["node-c"] == 0 and shared["node-a"] > 0


def test_a_node_with_no_external_slots_trains_on_local_groups_only(
    runs: list[tuple[Path, list[list[NodeRound]]]],
) -> None:
    _, done = runs[0]
    b_rounds = [r for node_rounds in done for r in node_rounds if r.node_id == "node-b"]
    assert all(bg.source == LOCAL for r in b_rounds for bg in r.batch.groups)
    assert all(row.local for r in b_rounds for row in r.report.built.rows)
    assert sum(len(r.batch.groups) for r in b_rounds) > 0  # trained on something


def test_the_same_manifest_gives_the_same_run(runs: list[tuple[Path, list[list[NodeRound]]]]) -> None:
    (dir1, _), (dir2, _) = runs

    def record(run_dir: Path, part: str, key: str) -> list[float]:
        return [
            row[key]
            for n in ("node-a", "node-b", "node-c")
            for row in read_rows(run_dir / part / f"{n}.jsonl")
        ]

    round_rewards = record(dir1, "rounds", "reward_mean")
    assert round_rewards == record(dir2, "rounds", "reward_mean")
    assert len(set(round_rewards)) > 1  # the rewards depend on what was sampled
    assert record(dir1, "steps", "loss") == record(dir2, "steps", "loss")
    assert any(record(dir1, "steps", "loss"))


def test_final_checkpoints_load_and_differ_from_the_initial_weights(
    runs: list[tuple[Path, list[list[NodeRound]]]],
) -> None:
    run_dir, _ = runs[0]
    store = CheckpointStore(run_dir / "checkpoints")
    for node in ("node-a", "node-b", "node-c"):
        assert store.versions(node) == [0, ROUNDS]
        final = store.latest(node)  # what an evaluation loads, in either mode
        assert final is not None
        initial = store.stored(node, 0)
        weights = []
        for uri, sha in (
            (initial.manifest_uri, initial.manifest_sha256),
            (final.manifest_uri, final.manifest_sha256),
        ):
            loaded, directory = read_manifest(uri, sha)
            weights.append(load_weights(loaded, directory))
        assert weights[0].keys() == weights[1].keys()
        assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_run_inprocess_runs_the_real_backend_and_refuses_a_used_run_directory(tmp_path: Path) -> None:
    m = parse_manifest(
        {
            "defaults": {"model": "tiny:1", "questions_per_round": 1, "completions_per_question": 2},
            "nodes": [
                {"id": "solo", "rounds": 2, "max_new_tokens": 4, "local_groups": 1, "external_groups": 0}
            ],
        }
    )
    out = io.StringIO()
    assert run_inprocess(m, tmp_path, out) == 0
    assert "round 2/2" in out.getvalue() and "solo" in out.getvalue()
    assert (tmp_path / "summary.json").exists()
    assert len(read_rows(tmp_path / "steps" / "solo.jsonl")) == 2
    assert CheckpointStore(tmp_path / "checkpoints").versions("solo") == [0, 2]
    with pytest.raises(ConfigError, match="fresh run directory"):
        run_inprocess(m, tmp_path, io.StringIO())


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"round_mode": "async"}, "round_mode: lockstep"),
        ({"sampler": {"round_mode": "deadline"}}, "round_mode: lockstep"),
        ({"generator": {"dtype": "bfloat16"}}, "generator dtype: float32"),
    ],
)
def test_what_one_shared_model_in_lock_step_cannot_run_is_refused(
    tmp_path: Path, defaults: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        InProcessSwarm(manifest(**defaults), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_settings_are_the_services_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = manifest()
    monkeypatch.setenv("SAPO_SAMPLER_MAX_PER_SOURCE", "1")  # as the launcher hands its environment on
    s = resolve(m, m.nodes[0], tmp_path / "checkpoints")
    assert (s.generator.node_id, s.generator.node_seed, s.trainer.questions_per_round) == ("node-a", 1, B)
    assert s.sampler.expected_peers == 1  # node-b; node-c shares nothing
    assert s.sampler.max_per_source == 1
    assert s.trainer.checkpoint_root == str(tmp_path / "checkpoints")
    monkeypatch.setenv("SAPO_SAMPLER_MAX_PER_SOURSE", "1")
    with pytest.raises(ConfigError, match="unknown setting"):
        resolve(m, m.nodes[0], tmp_path / "checkpoints")


@pytest.mark.parametrize("warm", [True, False])
def test_a_late_node_warm_starts_on_the_history_and_joins_the_swarm_round(tmp_path: Path, warm: bool) -> None:
    """node-c joins at round 2 of 3: with warm start its first two steps train on the groups node-a
    and node-b shared in rounds 0 and 1; without, they are empty; either way it samples round 2 with
    version 2, as lock-step needs."""
    m = manifest(rounds=3, sampler={"warm_start": {"enabled": warm}})
    seeds = {n.id: n.seed or 0 for n in m.nodes}
    swarm = InProcessSwarm(
        m, tmp_path, make_backend=lambda t: RightWhenEven(t, seeds[t.node_id]), joins={"node-c": 2}
    )
    swarm.start()
    done = [swarm.run_round(r) for r in range(swarm.rounds)]
    assert [[r.node_id for r in rs] for rs in done] == [["node-a", "node-b"]] * 2 + [
        ["node-a", "node-b", "node-c"]
    ]
    steps = read_rows(tmp_path / "steps" / "node-c.jsonl")
    assert [s["batch_id"] for s in steps] == [f"node-c/{i}" for i in range(3)]
    warm_steps = steps[:2]
    assert all(s["local_completions"] == 0 for s in warm_steps)
    assert any(s["external_completions"] for s in warm_steps) == warm
    sources = {c["node"] for s in warm_steps for c in s.get("contributions", [])}
    assert sources == ({"node-a", "node-b"} if warm else set())
    (row,) = read_rows(tmp_path / "rounds" / "node-c.jsonl")
    assert (row["round"], row["policy_version"]) == (2, 2)
    with pytest.raises(ConfigError, match="node-x"):
        InProcessSwarm(m, tmp_path / "other", joins={"node-x": 1})
