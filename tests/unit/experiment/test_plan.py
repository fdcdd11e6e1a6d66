"""Scenarios: shipped files are valid plans, configurations of one seed differ only in what they set,
node groups and task subsets reach the manifests, and bad scenarios fail with what to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sapo.cli import main
from sapo.experiment.plan import (
    checked_manifest,
    load_scenario,
    manifest_data,
    node_seed,
    parse_assignment,
    recorded_scenario,
    run_name,
    select,
)
from sapo.experiment.shipped import scenario_names
from sapo.sampler.assembler import RoundMode
from sapo.settings import ConfigError
from sapo.swarm.manifest import parse_manifest, resolve

SHIPPED = ("capability", "cpu", "homogeneous", "paper", "reference", "selection", "silo", "silo-135m")


def test_every_shipped_scenario_and_configuration_is_a_valid_plan() -> None:
    assert set(SHIPPED) <= set(scenario_names())
    for name in scenario_names():
        scenario = load_scenario(name)
        assert scenario.evaluation.questions >= 256  # the held-out set the reports need
        for config in scenario.configs:
            manifest = checked_manifest(scenario, config, seed=scenario.seeds[0])
            assert len(manifest.nodes) == sum(g.count for g in scenario.groups)
            modes = {resolve(manifest, n, Path("checkpoints")).sampler.round_mode for n in manifest.nodes}
            assert modes == {RoundMode.LOCKSTEP}


def test_configurations_of_one_seed_differ_only_in_what_they_set() -> None:
    scenario = load_scenario("reference")
    dumps = {}
    for config in scenario.configs:
        manifest = parse_manifest(manifest_data(scenario, config, seed=2))
        dumps[config] = [
            n.model_dump(exclude={"local_groups", "external_groups", "sampler"}) for n in manifest.nodes
        ]
        keep = {n.sampler.get("keep_local_zero_advantage", False) for n in manifest.nodes}
        assert keep == {config.endswith("-ref")}
        assert {(n.local_groups, n.external_groups) for n in manifest.nodes} == {
            (8, 0) if config.startswith("8/0") else (4, 4)
        }
    first = next(iter(dumps.values()))
    assert all(d == first for d in dumps.values())
    assert {n["model"] for n in first} == {"warm-bpe:2"}


def test_node_groups_and_task_subsets_reach_each_node() -> None:
    silo = parse_manifest(manifest_data(load_scenario("silo"), "4/4", seed=1))
    assert [n.id for n in silo.nodes] == ["calendar-1", "logic-1", "fraction-1", "arith-1"]
    assert silo.nodes[1].profile == "easy:propositional_logic"
    capability = parse_manifest(manifest_data(load_scenario("capability"), "8/0", seed=3))
    models = {n.id: n.model for n in capability.nodes}
    assert models == {
        "strong-1": "warm-bpe:3",
        "strong-2": "warm-bpe:3",
        "weak-1": "warm-bpe:3:64x2:100",
        "weak-2": "warm-bpe:3:64x2:100",
    }
    assert [n.seed for n in capability.nodes] == [node_seed(3, i) for i in range(4)]


def test_node_streams_never_repeat_across_nodes_or_seeds() -> None:
    seeds = {node_seed(seed, index) for seed in range(5) for index in range(8)}
    assert len(seeds) == 40


def test_paper_scenario_is_the_papers_setup() -> None:
    paper = load_scenario("paper")
    manifest = parse_manifest(manifest_data(paper, "2/6", seed=0))
    settings = resolve(manifest, manifest.nodes[0], Path("checkpoints"))
    generator, sampler = settings.generator, settings.sampler
    assert (len(paper.groups), paper.groups[0].count) == (1, 8)
    assert list(paper.configs) == ["8/0", "6/2", "4/4", "2/6"]
    assert (settings.trainer.rounds, sampler.questions_per_round, generator.completions_per_question) == (
        2000,
        8,
        8,
    )
    assert (generator.max_new_tokens, generator.profile, sampler.local_groups, sampler.external_groups) == (
        256,
        "paper",
        2,
        6,
    )


def test_selection_and_overrides() -> None:
    scenario = select(
        load_scenario("selection"),
        configs=["4/4-guided", "6/2"],
        seeds=[7],
        overrides=dict([parse_assignment("rounds=3"), parse_assignment("sampler.max_per_source=3")]),
        evaluation={"questions": 8},
    )
    assert list(scenario.configs) == ["4/4-guided", "6/2"]
    assert scenario.comparisons == (("6/2", "4/4-guided"),)  # the baseline left: the first picked
    node = parse_manifest(manifest_data(scenario, "4/4-guided", 7)).nodes[0]
    assert (node.rounds, node.model) == (3, "warm-bpe:7")
    assert node.sampler == {"lockstep_timeout_s": 120, "selection": "reward_guided", "max_per_source": 3}
    assert scenario.evaluation.questions == 8 and scenario.evaluation.samples == 4
    assert run_name("6/2", 3) == "i6-j2-s3" and run_name("4/4-guided", 0) == "4-4-guided-s0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"configs": {"8/0": {}, "Bad Name": {}}}, "configuration name 'Bad Name'"),
        ({"baseline": "9/9"}, "'9/9' is not one of the configurations"),
        ({"comparisons": ["8/0 against 4/4"]}, "write '<config> vs <config>'"),
        ({"nodes": [{"name": "a", "count": 1}, {"name": "a", "count": 1}]}, "unique"),
        ({"evaluation": {"profile": "easy", "questions": 256}}, "evaluation.samples"),
        ({"rounds": 3}, "rounds: Extra inputs are not permitted"),
    ],
)
def test_bad_scenarios_fail_saying_what_to_fix(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    data = yaml.safe_load((Path(load_scenario("homogeneous").source)).read_text()) | change
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        load_scenario(str(path))


def test_a_bad_service_setting_fails_at_plan_time_naming_it(tmp_path: Path) -> None:
    scenario = select(load_scenario("homogeneous"), overrides={"sampler.selektion": "uniform"})
    with pytest.raises(ConfigError, match="SAPO_SAMPLER_SELEKTION"):
        checked_manifest(scenario, "4/4", 0)
    with pytest.raises(ConfigError, match="not in scenario homogeneous"):
        select(load_scenario("homogeneous"), configs=["4/4-guided"])
    with pytest.raises(ConfigError, match="one-group scenarios"):
        select(load_scenario("silo"), nodes=2)


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"nodes": 1001}, r"^--nodes 1001: .*less than or equal to 1000"),
        ({"evaluation": {"questions": 100_001}}, r"^--eval-questions 100001: .*less than or equal to 100000"),
        ({"evaluation": {"samples": 0}}, r"^--eval-samples 0: .*greater than or equal to 1"),
    ],
)
def test_command_line_sizes_keep_the_scenario_files_bounds(selection: dict[str, Any], message: str) -> None:
    """They bypassed the bounds a scenario file is held to: `--nodes 99999` planned for minutes."""
    with pytest.raises(ConfigError, match=message):
        select(load_scenario("cpu"), **selection)
    assert select(load_scenario("cpu"), nodes=1000, evaluation={"samples": 256}).groups[0].count == 1000


def test_a_mix_from_configs_the_nodes_cannot_run_names_the_flag_and_what_it_allows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for mix in ("99/99", "0/0", "3/300"):
        with pytest.raises(ConfigError, match=rf"^--configs {mix}: .* allows I <= 8 \(a lock-step round"):
            select(load_scenario("cpu"), configs=[mix])
    # a larger round admits a larger I; the bound follows the scenario as selected
    larger = select(load_scenario("cpu"), configs=["12/2"], overrides={"questions_per_round": 12})
    assert list(larger.configs) == ["12/2"]
    assert main(["experiment", "--out", str(tmp_path / "plan"), "--plan-only", "--configs", "99/99"]) == 2
    assert "--configs 99/99" in caplog.text and "SAPO_SAMPLER" not in caplog.text


def test_cli_plan_only_writes_the_plan_and_bad_configurations_fail_with_what_to_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "plan"
    args = ["experiment", "--out", str(out), "--plan-only", "--configs", "8/0,4/4", "--seeds", "5"]
    assert main(args) == 0
    plan = json.loads((out / "experiment.json").read_text())
    assert (list(plan["configs"]), plan["seeds"], plan["name"]) == (["8/0", "4/4"], [5], "cpu")
    assert sorted(p.name for p in (out / "manifests").iterdir()) == ["i4-j4-s5.json", "i8-j0-s5.json"]
    assert sorted(p.name for p in (out / "helm" / "i4-j4-s5").iterdir())[0] == "node-1.yaml"
    assert main(["experiment", "--out", str(out), "--plan-only", "--configs", "4-4"]) == 2
    assert "not an I/J mix" in caplog.text
    assert main(["experiment", "--scenario", "nope", "--out", str(out), "--plan-only"]) == 2
    assert "neither a shipped scenario" in caplog.text


def test_cli_mistakes_are_one_line_errors_not_tracebacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan"
    for flags in (["--eval-questions", "-4"], ["--eval-samples", "0"], ["--report-only"], ["--nodes", "0"]):
        with pytest.raises(SystemExit) as usage:
            main(["experiment", "--out", str(out), "--plan-only", *flags])
        assert usage.value.code == 2
    assert "not allowed with argument --plan-only" in capsys.readouterr().err
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert main(["experiment", "--out", str(taken), "--plan-only"]) == 1
    assert f"File exists: {taken}" in caplog.text
    assert main(["experiment", "--out", str(tmp_path / "empty"), "--report-only"]) == 1
    assert "no finished runs under" in caplog.text
    assert main(["results", "--root", str(tmp_path / "absent")]) == 1
    assert main(["report", str(tmp_path / "absent")]) == 1
    assert "absent is no directory" in caplog.text
    assert "Traceback" not in caplog.text


def test_invocations_split_by_configuration_leave_the_whole_experiment_recorded(tmp_path: Path) -> None:
    plan_only = ["experiment", "--scenario", "selection", "--out", str(tmp_path / "split"), "--plan-only"]
    assert main([*plan_only, "--configs", "4/4"]) == 0
    assert main([*plan_only, "--configs", "8/0"]) == 0
    args = [*plan_only, "--configs", "4/4-guided"]
    assert main([*args, "--seeds", "7"]) == 0
    plan = json.loads((tmp_path / "split" / "experiment.json").read_text())
    # the scenario file's order and its own comparisons among what ran, every seed run
    assert list(plan["configs"]) == ["8/0", "4/4", "4/4-guided"]
    assert plan["baseline"] == "8/0"
    assert plan["comparisons"] == ["4/4 vs 8/0", "4/4-guided vs 8/0", "4/4-guided vs 4/4"]
    assert plan["seeds"] == [0, 1, 2, 7]
    # another experiment (here: another held-out set) is recorded as it is, not merged
    assert main([*args, "--eval-questions", "64"]) == 0
    plan = json.loads((tmp_path / "split" / "experiment.json").read_text())
    assert (list(plan["configs"]), plan["evaluation"]["questions"]) == (["4/4-guided"], 64)


def test_a_scenario_that_is_not_utf8_text_says_so(tmp_path: Path) -> None:
    """It ended `sapo experiment` in a UnicodeDecodeError traceback."""
    path = tmp_path / "scenario.yaml"
    path.write_bytes(b"\xff\xfe name: x")
    with pytest.raises(ConfigError, match=f"^cannot read scenario {path}: 'utf-8' codec can't decode"):
        load_scenario(str(path))


@pytest.mark.parametrize("content", [b"garbage{", b"\xff", b"[]", b"5"])
def test_a_corrupt_experiment_record_is_named_not_a_traceback(tmp_path: Path, content: bytes) -> None:
    """A damaged experiment.json in --out ended every command on it in a JSONDecodeError (or
    UnicodeDecodeError, TypeError) traceback."""
    (tmp_path / "experiment.json").write_bytes(content)
    with pytest.raises(ConfigError, match=r"experiment\.json is not the record `sapo experiment` writes"):
        recorded_scenario(tmp_path / "experiment.json")


@pytest.mark.parametrize("seeds", ["-1", "0,-2", "a,b", "1.5", str(2**53 + 1)])
def test_a_seed_that_is_not_a_non_negative_integer_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, seeds: str
) -> None:
    """A negative seed was refused only as a node's SAPO_GENERATOR_NODE_SEED, with a number never typed."""
    with pytest.raises(SystemExit) as exit_info:
        main(["experiment", "--out", str(tmp_path), "--plan-only", "--seeds", seeds])
    assert exit_info.value.code == 2
    assert (
        "argument --seeds: seeds are integers 0..9007199254740992, e.g. 0,1,2; got" in capsys.readouterr().err
    )
