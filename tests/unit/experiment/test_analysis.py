"""Experiment analysis on hand-made run records: the three per-round metrics, paired comparisons per
node group, the data-silo transfer, the tables, the plots and the table across experiments."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sapo.experiment.analysis import (
    RESULT,
    Spread,
    comparisons,
    load_runs,
    max_drawdown,
    moving_average,
    run_metrics,
    write_report,
)
from sapo.experiment.results import BEGIN, END, write_results_table
from sapo.settings import ConfigError
from sapo.swarm.history import append_row

EASY = ("basic_arithmetic", "calendar_arithmetic", "fraction_simplification", "propositional_logic")


def _heldout(values: list[float]) -> dict[str, Any]:
    """An evaluation of len(values) questions, the tasks of EASY in turn."""
    tasks = [EASY[i % len(EASY)] for i in range(len(values))]
    return {"reward_mean": sum(values) / len(values), "per_question": values, "question_tasks": tasks}


def _write_run(
    root: Path,
    config: str,
    seed: int,
    own: dict[str, list[float]],
    batch: dict[str, list[float]],
    *,
    local_groups: int | None = 4,
    completions: int | None = 8,
    counts: tuple[int, int] | None = None,
    local_mean: float = 0.0,
    after: dict[str, list[float]] | None = None,
    profiles: dict[str, str] | None = None,
    confirmation: bool = False,
) -> None:
    """A run record; `counts` = (local, external) completions of every step (None: an old record)."""
    name = config.replace("/", "-") + f"-s{seed}" + ("-services" if confirmation else "")
    run_dir = root / "runs" / name
    for node, values in own.items():
        for round_, value in enumerate(values):
            append_row(run_dir / "rounds" / f"{node}.jsonl", {"round": round_, "reward_mean": value})
        for version, value in enumerate(batch[node], start=1):
            step: dict[str, Any] = {"version": version, "reward_mean": value, "local_reward_mean": local_mean}
            if counts is not None:
                step |= {"local_completions": counts[0], "external_completions": counts[1]}
            append_row(run_dir / "steps" / f"{node}.jsonl", step)
    nodes = sorted(own)
    manifest = {
        "nodes": [
            {
                "id": n,
                "local_groups": local_groups,
                "completions_per_question": completions,
                "profile": "easy",
            }
            | ({"profile": profiles[n]} if profiles else {})
            for n in nodes
        ]
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    after = after or {n: [0.2 + 0.1 * seed] * 8 for n in nodes}
    result = {
        "config": config,
        "mix": config if "/" in config and "-" not in config else "4/4",
        "seed": seed,
        "mode": "services" if confirmation else "inprocess",
        "confirmation": confirmation,
        "wall_seconds": 10.0,
        "eval_seconds": 5.0,
        "nodes": nodes,
        "final_versions": {n: len(batch[n]) for n in nodes},
        "heldout_before": {n: _heldout([0.2] * 8) for n in nodes},
        "heldout_after": {n: _heldout(after[n]) for n in nodes},
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
    assert Spread.of([0.5]).cell(2, signed=True) == "+0.50"


def test_paper_reference_and_on_policy_metrics_count_apart(tmp_path: Path) -> None:
    """4 local slots of 8 completions and 16 external completions per batch: the batch mean 0.5 with
    local mean 0.25 puts the external mean at (0.5 * 48 - 0.25 * 32) / 16 = 1.0; the reference counts
    its local slots at the round's on-policy mean instead: (32 * own + 16 * 1.0) / 48."""
    _write_run(
        tmp_path,
        "4/4",
        0,
        own={"a": [0.1, 0.4], "b": [0.4, 0.1]},
        batch={"a": [0.5, 0.5], "b": [0.5, 0.5]},
        counts=(32, 16),
        local_mean=0.25,
    )
    (run,) = load_runs(tmp_path)
    assert run.reference["a"] == pytest.approx([(32 * 0.1 + 16) / 48, (32 * 0.4 + 16) / 48])
    metrics = run_metrics(run)
    assert metrics["paper_total"] == pytest.approx(2.0)
    assert metrics["own_total"] == pytest.approx(1.0)
    assert metrics["own_mean"] == pytest.approx(0.25)
    assert metrics["reference_total"] == pytest.approx(2 * (32 * 0.5 + 32) / 48)
    assert metrics["drawdown"] == 0.0  # the swarm mean is flat at 0.25


def test_short_keys_left_to_their_defaults_read_as_the_defaults(tmp_path: Path) -> None:
    """A manifest writes null for a short key it leaves to the service: I from the mix, L from the
    generator's default (8)."""
    runs = {}
    for name, keys in {"explicit": (4, 8), "defaults": (None, None)}.items():
        _write_run(
            tmp_path / name,
            "4/4",
            0,
            own={"a": [0.1, 0.4]},
            batch={"a": [0.5, 0.5]},
            local_groups=keys[0],
            completions=keys[1],
            counts=(32, 16),
            local_mean=0.25,
        )
        (runs[name],) = load_runs(tmp_path / name)
    assert runs["defaults"].reference == runs["explicit"].reference
    assert runs["defaults"].reference["a"] == pytest.approx([(32 * 0.1 + 16) / 48, (32 * 0.4 + 16) / 48])


def test_records_of_earlier_versions_load_without_the_reference_metric(tmp_path: Path) -> None:
    _write_run(tmp_path, "8/0", 0, own={"node-1": [0.2]}, batch={"node-1": [0.3]})
    (run,) = load_runs(tmp_path)
    assert math.isnan(run_metrics(run)["reference_total"])
    assert run.groups == {"node-1": "node"}


def test_comparisons_pair_rounds_of_one_seed_for_the_swarm_and_each_group(tmp_path: Path) -> None:
    for seed in (0, 1):
        base = 0.1 * (seed + 1)
        own = {"strong-1": [base + 0.1] * 6, "weak-1": [base] * 6}
        _write_run(tmp_path, "8/0", seed, own=own, batch=own, counts=(48, 0), local_groups=8)
        shared = {"strong-1": [base + 0.08] * 6, "weak-1": [base + 0.06] * 6}
        _write_run(tmp_path, "4/4", seed, own=shared, batch=shared, counts=(32, 16))
    runs = load_runs(tmp_path)
    found = {c.group: c for c in comparisons(runs, [("4/4", "8/0")])}
    assert set(found) == {"all", "strong", "weak"}
    assert found["weak"].own.effect == pytest.approx(0.06)
    assert found["weak"].own.verdict == "better"
    assert found["strong"].own.effect == pytest.approx(-0.02)
    assert found["strong"].own.verdict == "worse"
    assert found["all"].own.effect == pytest.approx(0.02)
    assert found["all"].own_per_seed == pytest.approx((0.02, 0.02))
    assert found["all"].relative("own") == pytest.approx(0.02 / 0.2)  # B's mean: (0.15 + 0.25) / 2


def test_transfer_counts_only_the_tasks_a_node_never_samples(tmp_path: Path) -> None:
    """A silo node samples calendar_arithmetic (questions 1, 5 of each 4); sharing raises its held-out
    reward on those by 0.4 and on the others by 0.1: the transfer is 0.1."""
    profiles = {"cal-1": "easy:calendar_arithmetic", "logic-1": "easy:propositional_logic"}
    own = {n: [0.2] * 3 for n in profiles}
    _write_run(tmp_path, "8/0", 0, own=own, batch=own, profiles=profiles, after={n: [0.2] * 8 for n in own})
    raised = [0.3, 0.6, 0.3, 0.3] * 2
    _write_run(tmp_path, "4/4", 0, own=own, batch=own, profiles=profiles, after={n: raised for n in own})
    runs = load_runs(tmp_path, heldout_profile="easy")
    assert runs[0].other_tasks("cal-1") == frozenset(EASY) - {"calendar_arithmetic"}
    (comparison,) = [c for c in comparisons(runs, [("4/4", "8/0")]) if c.group == "cal"]
    assert comparison.transfer.effect == pytest.approx(0.1)
    assert comparison.heldout.effect == pytest.approx((0.1 * 3 + 0.4) / 4)


def test_report_tables_plots_and_the_table_across_experiments(tmp_path: Path) -> None:
    root = tmp_path / "results"
    out = root / "demo"
    for seed in (0, 1):
        base = {"node-1": [0.2 + 0.01 * seed] * 5}
        _write_run(out, "8/0", seed, own=base, batch=base, counts=(40, 0), local_groups=8)
        shared = {"node-1": [0.25 + 0.01 * seed] * 5}
        _write_run(out, "4/4", seed, own=shared, batch={"node-1": [0.4] * 5}, counts=(32, 16))
    _write_run(out, "4/4", 0, own={"node-1": [0.24] * 5}, batch={"node-1": [0.4] * 5}, confirmation=True)
    (out / "experiment.json").write_text(json.dumps({"name": "demo"}))
    report = write_report(out, "# test", order=["8/0", "4/4"], pairs=[("4/4", "8/0")]).read_text()
    compared = report.split("## Comparisons")[1].split("##")[0]
    assert "| 4/4 vs 8/0 | all | 2 | +0.050 [+0.050, +0.050] | +24.4% | better | +0.050, +0.050 |" in compared
    table = report.split("## Configurations")[1].split("##")[0]
    assert table.index("| 8/0 |") < table.index("| 4/4 |")
    confirmed = report.split("## Confirmation through the Kafka services")[1].split("##")[0]
    assert "| 4/4, seed 0 | 0.240 / 0.250 | -0.010 [-0.010, -0.010] |" in confirmed
    for name in ("comparison.png", "curves_own.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "summary.json").read_text())
    assert {(r["config"], r["seed"], r["confirmation"]) for r in summary["runs"]} == {
        ("8/0", 0, False),
        ("8/0", 1, False),
        ("4/4", 0, False),
        ("4/4", 1, False),
        ("4/4", 0, True),
    }
    readme = root / "README.md"
    readme.write_text(f"# Results\n\nprose before\n\n{BEGIN}\nold table\n{END}\n\nprose after\n")
    text = write_results_table(root).read_text()
    assert "old table" not in text and "prose before" in text and "prose after" in text
    assert (
        "| [demo](demo/report.md) | 4/4 vs 8/0 | all | 2 x 5 | +0.050 [+0.050, +0.050] | +24.4% | better |"
        in text
    )
    assert "| 4/4: -0.010 [-0.010, -0.010] | " in text  # the services check of the scenario


def test_report_needs_finished_runs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no finished runs"):
        write_report(tmp_path, "# test")


@pytest.mark.parametrize("summary", [b"garbage", b"\xff", b"[]", b'{"runs": 5}'])
def test_a_damaged_summary_is_named_by_its_directory(tmp_path: Path, summary: bytes) -> None:
    """`sapo results` ended in a JSONDecodeError, UnicodeDecodeError or TypeError traceback."""
    (tmp_path / "exp-1").mkdir()
    (tmp_path / "exp-1" / "summary.json").write_bytes(summary)
    with pytest.raises(ConfigError, match=r"exp-1: its summary\.json or experiment\.json is not what"):
        write_results_table(tmp_path)
