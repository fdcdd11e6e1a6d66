"""A whole experiment, small: a scenario file with two node groups and two configurations, run as
in-process swarms of tiny models, evaluated, reported; running the command again skips what is finished."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import yaml

from sapo.experiment.plan import load_scenario, recorded_scenario
from sapo.experiment.runner import planned_runs, run_experiment, write_scenario_report

SCENARIO = {
    "name": "tiny",
    "description": "two groups of tiny models",
    "seeds": [3],
    "evaluation": {"profile": "easy", "questions": 4, "samples": 2},
    "defaults": {
        "model": "tiny:{seed}",
        "rounds": 2,
        "questions_per_round": 2,
        "completions_per_question": 2,
        "max_new_tokens": 4,
    },
    "nodes": [
        {"name": "calendar", "count": 1, "profile": "easy:calendar_arithmetic"},
        {"name": "mixed", "count": 1, "profile": "easy", "model": "tiny:{seed}:16x1"},
    ],
    "configs": {
        "2/0": {},
        "1/1-ref": {"local_groups": 1, "external_groups": 1, "sampler": {"keep_local_zero_advantage": True}},
    },
    "confirm": "1/1-ref",
}


def test_experiment_runs_evaluates_reports_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    scenario = load_scenario(str(path))
    out_dir = tmp_path / "out"
    assert [r.name for r in planned_runs(scenario, "inprocess", confirm=True)] == ["1-1-ref-s3-services"]
    out = io.StringIO()
    code = run_experiment(
        scenario, out_dir, mode="inprocess", command="sapo experiment first", keep_checkpoints=False, out=out
    )
    assert code == 0, out.getvalue()
    for run in ("i2-j0-s3", "1-1-ref-s3"):
        run_dir = out_dir / "runs" / run
        result = json.loads((run_dir / "result.json").read_text())
        assert result["final_versions"] == {"calendar-1": 2, "mixed-1": 2}
        assert result["groups"] == {"calendar-1": "calendar", "mixed-1": "mixed"}
        assert set(result["heldout_after"]) == set(result["heldout_before"]) == {"calendar-1", "mixed-1"}
        assert len(result["heldout_after"]["mixed-1"]["per_question"]) == 4
        assert not (run_dir / "checkpoints").exists()  # evaluated, then removed
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert [n["model"] for n in manifest["nodes"]] == ["tiny:3", "tiny:3:16x1"]
        assert {s["version"] for s in map(json.loads, (run_dir / "steps" / "mixed-1.jsonl").open())} == {1, 2}
    assert len(list((out_dir / "baselines").glob("*.json"))) == 2  # one per initial model
    report = (out_dir / "report.md").read_text()
    assert "| 1/1-ref vs 2/0 | all | 1 |" in report and "| 1/1-ref vs 2/0 | calendar | 1 |" in report
    assert "easy:calendar_arithmetic" in (out_dir / "experiment.json").read_text()

    again = io.StringIO()
    assert (
        run_experiment(scenario, out_dir, mode="inprocess", command="b", keep_checkpoints=False, out=again)
        == 0
    )
    assert again.getvalue().count("finished earlier, skipped") == 2
    # the report names the command its runs came from: not one that ran nothing, not a report-only one
    write_scenario_report(scenario, out_dir, "sapo experiment --report-only")
    report = (out_dir / "report.md").read_text()
    header = [line for line in report.splitlines() if line.startswith("Reproduce")]
    assert header == ["Reproduce: `sapo experiment first`"]
    # a finished run evaluated on another held-out set is not silently mixed into the report
    other = replace(scenario, evaluation=scenario.evaluation.model_copy(update={"questions": 8}))
    refused = io.StringIO()
    assert (
        run_experiment(other, out_dir, mode="inprocess", command="c", keep_checkpoints=False, out=refused)
        == 2
    )
    assert "evaluated on 4 questions x 2 samples, this command asks for 8 x 2" in refused.getvalue()
    assert json.loads((out_dir / "experiment.json").read_text())["evaluation"]["questions"] == 4
    recorded = recorded_scenario(out_dir / "experiment.json")
    assert recorded is not None and recorded.as_data() == scenario.as_data()


def test_report_names_every_command_that_ran_runs(tmp_path: Path) -> None:
    """An in-process experiment and its `--confirm` run are two commands; both are reproduce lines."""
    from sapo.experiment.runner import record_command, recorded_commands, report_header

    in_process, confirm = "sapo experiment --in-process", "sapo experiment --confirm"

    for command in (in_process, confirm, in_process):
        record_command(tmp_path, command)
    assert recorded_commands(tmp_path) == [in_process, confirm]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    header = report_header(load_scenario(str(path)), recorded_commands(tmp_path))
    assert "Reproduce: `sapo experiment --in-process`\nReproduce: `sapo experiment --confirm`" in header


def test_report_header_names_the_configurations_of_every_finished_run(tmp_path: Path) -> None:
    """Runs of one directory can come from several `--configs` invocations: the header names all."""
    from sapo.experiment.plan import select
    from sapo.experiment.runner import report_header

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    scenario = load_scenario(str(path))
    first, *others = scenario.configs
    header = report_header(select(scenario, configs=[first]), [], ran=[*others, first])
    assert f"configurations: {', '.join([first, *others])};" in header
