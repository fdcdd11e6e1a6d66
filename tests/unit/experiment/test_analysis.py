"""Experiment analysis on hand-made run records: the metrics, the tables and the plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sapo.experiment.analysis import (
    RESULT,
    Spread,
    load_runs,
    max_drawdown,
    moving_average,
    run_metrics,
    write_report,
)
from sapo.swarm.history import append_row


def _write_run(
    root: Path, mix: str, seed: int, own: dict[str, list[float]], batch: dict[str, list[float]]
) -> None:
    run_dir = root / "runs" / f"{mix.replace('/', '-')}-s{seed}"
    for node, values in own.items():
        for round_, value in enumerate(values):
            append_row(run_dir / "rounds" / f"{node}.jsonl", {"round": round_, "reward_mean": value})
        for version, value in enumerate(batch[node], start=1):
            append_row(run_dir / "steps" / f"{node}.jsonl", {"version": version, "reward_mean": value})
    result = {
        "mix": mix,
        "seed": seed,
        "wall_seconds": 10.0,
        "nodes": sorted(own),
        "heldout_before": {"reward_mean": 0.2},
        "heldout_after": {node: {"reward_mean": 0.2 + 0.1 * seed} for node in own},
    }
    (run_dir / RESULT).write_text(json.dumps(result))


def test_moving_average_and_drawdown() -> None:
    assert moving_average([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert max_drawdown([0.1, 0.5, 0.2, 0.4, 0.6, 0.3]) == pytest.approx(0.3)
    assert max_drawdown([0.1, 0.2, 0.3]) == 0.0


def test_spread_cells() -> None:
    spread = Spread.of([1.0, 2.0, 3.0, math.nan])
    assert (spread.mean, spread.low, spread.high, spread.n) == (2.0, 1.0, 3.0, 3)
    assert spread.cell(1) == "2.0 ± 1.0 [1.0, 3.0]"
    assert Spread.of([]).cell() == "-"
    assert Spread.of([0.5]).cell(2, signed=True) == "+0.50 [+0.50, +0.50]"


def test_metrics_count_the_paper_total_and_the_on_policy_reward_apart(tmp_path: Path) -> None:
    _write_run(
        tmp_path,
        "4/4",
        0,
        own={"a": [0.1, 0.2, 0.3], "b": [0.3, 0.2, 0.1]},
        batch={"a": [0.5, 0.5, 0.5], "b": [0.25, 0.25, 0.25]},
    )
    (run,) = load_runs(tmp_path)
    metrics = run_metrics(run)
    assert metrics["paper_total"] == pytest.approx(2.25)
    assert metrics["own_total"] == pytest.approx(1.2)
    assert metrics["heldout_delta"] == pytest.approx(0.0)
    assert metrics["drawdown"] == 0.0  # the swarm mean is flat at 0.2


def test_report_pairs_each_configuration_with_isolation_on_the_same_seed(tmp_path: Path) -> None:
    for seed in (0, 1):
        base = 0.1 * (seed + 1)
        _write_run(tmp_path, "8/0", seed, own={"a": [base] * 4}, batch={"a": [base] * 4})
        _write_run(tmp_path, "4/4", seed, own={"a": [base + 0.05] * 4}, batch={"a": [base + 0.1] * 4})
    report = write_report(tmp_path, "# test").read_text()
    table = report.split("## Configurations")[1].split("##")[0]
    assert table.index("| 8/0 |") < table.index("| 4/4 |")  # isolation first
    paired = report.split("same seed")[1].split("##")[0]
    # +0.1 per round on 4 rounds on both seeds: the paired difference has no spread
    assert "| 4/4 | +0.400 ± 0.000 [+0.400, +0.400] | +0.200 ± 0.000" in paired
    for name in ("comparison.png", "curves_own.png", "curves_batch.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {(r["mix"], r["seed"]) for r in summary["runs"]} == {
        ("8/0", 0),
        ("8/0", 1),
        ("4/4", 0),
        ("4/4", 1),
    }


def test_report_needs_finished_runs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        write_report(tmp_path, "# test")
