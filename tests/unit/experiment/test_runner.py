"""A whole experiment, small: two configurations of a 2-node in-process swarm of tiny models, then the
report; running the command again skips what is finished."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

from sapo.experiment.plan import PROFILES, select
from sapo.experiment.runner import run_experiment


def test_experiment_runs_evaluates_reports_and_resumes(tmp_path: Path) -> None:
    profile = dataclasses.replace(
        select(PROFILES["cpu"], mixes=((2, 0), (1, 1)), seeds=(3,), rounds=2, nodes=2, model="tiny:{seed}"),
        questions_per_round=2,
        completions_per_question=2,
        max_new_tokens=4,
        eval_questions=4,
        eval_samples=2,
    )
    out = io.StringIO()
    code = run_experiment(
        profile, tmp_path, mode="inprocess", command="test", keep_checkpoints=False, out=out
    )
    assert code == 0, out.getvalue()
    for run in ("i2-j0-s3", "i1-j1-s3"):
        run_dir = tmp_path / "runs" / run
        result = json.loads((run_dir / "result.json").read_text())
        assert result["final_versions"] == {"node-1": 2, "node-2": 2}
        assert set(result["heldout_after"]) == {"node-1", "node-2"}
        assert result["heldout_before"]["questions"] == 4
        assert not (run_dir / "checkpoints").exists()  # evaluated, then removed
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert {n["model"] for n in manifest["nodes"]} == {"tiny:3"}
    report = (tmp_path / "report.md").read_text()
    assert "| 2/0 | 1 |" in report and "| 1/1 |" in report
    assert (tmp_path / "baseline-s3.json").exists()

    again = io.StringIO()
    assert (
        run_experiment(profile, tmp_path, mode="inprocess", command="test", keep_checkpoints=False, out=again)
        == 0
    )
    assert again.getvalue().count("finished earlier, skipped") == 2
