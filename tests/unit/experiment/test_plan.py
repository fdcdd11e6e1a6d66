"""Experiment plans: the four configurations differ only in I/J, and bad overrides fail with what to set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo.cli import main
from sapo.experiment.plan import PAPER_MIXES, PROFILES, manifest_data, node_seed, parse_mix, run_name, select
from sapo.settings import ConfigError
from sapo.swarm.manifest import parse_manifest


def test_every_profile_and_configuration_is_a_valid_manifest() -> None:
    for profile in PROFILES.values():
        for mix in profile.mixes:
            manifest = parse_manifest(manifest_data(profile, mix, seed=1))
            assert len(manifest.nodes) == profile.nodes
            assert {(n.local_groups, n.external_groups) for n in manifest.nodes} == {mix}
            assert {n.round_mode for n in manifest.nodes} == {"lockstep"}


def test_configurations_of_one_seed_differ_only_in_the_mix() -> None:
    profile = PROFILES["cpu"]
    dumps = []
    for mix in PAPER_MIXES:
        manifest = parse_manifest(manifest_data(profile, mix, seed=2))
        nodes = [n.model_dump(exclude={"local_groups", "external_groups"}) for n in manifest.nodes]
        dumps.append(nodes)
    assert all(d == dumps[0] for d in dumps)
    assert {n["model"] for n in dumps[0]} == {"warm:2"}


def test_node_streams_never_repeat_across_nodes_or_seeds() -> None:
    seeds = {node_seed(seed, index) for seed in range(5) for index in range(8)}
    assert len(seeds) == 40


def test_paper_profile_is_the_papers_setup() -> None:
    paper = PROFILES["paper"]
    assert (paper.nodes, paper.rounds, paper.questions_per_round, paper.completions_per_question) == (
        8,
        2000,
        8,
        8,
    )
    assert paper.mixes == ((8, 0), (6, 2), (4, 4), (2, 6))
    assert paper.max_new_tokens == 256


def test_parse_mix_and_names() -> None:
    assert parse_mix(" 6/2 ") == (6, 2)
    assert run_name((6, 2), 3) == "i6-j2-s3"
    with pytest.raises(ConfigError, match="I/J"):
        parse_mix("6-2")


def test_select_refuses_a_mix_a_round_cannot_fill() -> None:
    with pytest.raises(ConfigError, match="cannot exceed"):
        select(PROFILES["cpu"], mixes=((9, 0),))
    with pytest.raises(ConfigError, match="at least one group"):
        select(PROFILES["cpu"], mixes=((0, 0),))
    with pytest.raises(ConfigError, match="at least 2 nodes"):
        select(PROFILES["cpu"], nodes=1)
    chosen = select(PROFILES["cpu"], seeds=(7,), rounds=3, model="tiny:{seed}")
    assert (chosen.seeds, chosen.rounds) == ((7,), 3)
    assert parse_manifest(manifest_data(chosen, (4, 4), 7)).nodes[0].model == "tiny:7"


def test_cli_plan_only_writes_the_plan_and_bad_configurations_fail_with_what_to_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "plan"
    assert main(["experiment", "--out", str(out), "--plan-only", "--configs", "8/0,4/4", "--seeds", "5"]) == 0
    plan = json.loads((out / "experiment.json").read_text())
    assert (plan["mixes"], plan["seeds"]) == ([[8, 0], [4, 4]], [5])
    assert sorted(p.name for p in (out / "manifests").iterdir()) == ["i4-j4-s5.json", "i8-j0-s5.json"]
    assert main(["experiment", "--out", str(out), "--plan-only", "--configs", "4-4"]) == 2
    assert "write it as I/J" in caplog.text
