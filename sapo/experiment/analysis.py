"""From an experiment's run directories to numbers, a markdown report and reward-curve plots.

Metrics of one run (N nodes, R rounds):
- `paper_total`: the paper's metric, sum over nodes and steps of each training batch's mean reward,
  external groups included (docs/architecture.md). Filtering alone raises it: every surviving group of
  binary rewards averages >= 1/L.
- `own_total` / `own_last`: the on-policy reward, each node's mean over every completion it sampled in
  a round (no filter), summed over nodes and rounds / averaged over nodes and the last rounds.
- `heldout_after` and `heldout_delta`: mean held-out reward of the nodes' final policies, and its
  change from the initial model's (the same for every node of a run).
- `drawdown`: the largest fall of the swarm's smoothed on-policy curve below its running peak; the
  paper's 2/6 "oscillates and forgets", which shows up here.

Across seeds a configuration is reported as mean, sample standard deviation and min-max, and, since
all configurations of one seed share the initial model, also as its paired difference to isolation
(the first configuration, 8/0 by default) seed by seed.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, read_rows

SMOOTH = 5
"""Rounds in the moving average of the curves and the drawdown (8 questions make one round noisy)."""
LAST_ROUNDS = 5
RESULT = "result.json"


@dataclass(frozen=True)
class RunRecord:
    """One finished run: per node its on-policy round rewards and its batch rewards by version."""

    mix: str
    seed: int
    wall_seconds: float
    own: dict[str, list[float]]
    batch: dict[str, list[float]]
    heldout_before: float
    heldout_after: dict[str, float]

    @property
    def nodes(self) -> list[str]:
        return sorted(self.own)


def load_run(run_dir: Path) -> RunRecord:
    result = json.loads((run_dir / RESULT).read_text())
    nodes = result["nodes"]
    own = {n: [r["reward_mean"] for r in read_rows(run_dir / ROUNDS_DIR / f"{n}.jsonl")] for n in nodes}
    batch = {n: [s["reward_mean"] for s in read_rows(run_dir / STEPS_DIR / f"{n}.jsonl")] for n in nodes}
    return RunRecord(
        mix=result["mix"],
        seed=int(result["seed"]),
        wall_seconds=float(result["wall_seconds"]),
        own=own,
        batch=batch,
        heldout_before=float(result["heldout_before"]["reward_mean"]),
        heldout_after={n: float(e["reward_mean"]) for n, e in result["heldout_after"].items()},
    )


def moving_average(values: Sequence[float], window: int = SMOOTH) -> list[float]:
    """Trailing mean over up to `window` values (the first points average what exists so far)."""
    out: list[float] = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(statistics.fmean(part))
    return out


def max_drawdown(values: Sequence[float]) -> float:
    """Largest drop from a running peak to a later value (0 for a curve that never falls)."""
    peak, worst = -math.inf, 0.0
    for value in values:
        peak = max(peak, value)
        worst = max(worst, peak - value)
    return worst


def swarm_curve(per_node: dict[str, list[float]]) -> list[float]:
    """Mean over nodes, round by round, over the rounds every node has."""
    length = min((len(v) for v in per_node.values()), default=0)
    return [statistics.fmean(v[i] for v in per_node.values()) for i in range(length)]


def run_metrics(run: RunRecord) -> dict[str, float]:
    own_curve = swarm_curve(run.own)
    after = list(run.heldout_after.values())
    return {
        "paper_total": sum(sum(v) for v in run.batch.values()),
        "own_total": sum(sum(v) for v in run.own.values()),
        "own_first": statistics.fmean(own_curve[:LAST_ROUNDS]) if own_curve else math.nan,
        "own_last": statistics.fmean(own_curve[-LAST_ROUNDS:]) if own_curve else math.nan,
        "heldout_before": run.heldout_before,
        "heldout_after": statistics.fmean(after) if after else math.nan,
        "heldout_delta": (statistics.fmean(after) - run.heldout_before) if after else math.nan,
        "drawdown": max_drawdown(moving_average(own_curve)),
        "wall_seconds": run.wall_seconds,
    }


@dataclass(frozen=True)
class Spread:
    mean: float
    sd: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan, math.nan, 0)
        sd = statistics.stdev(finite) if len(finite) > 1 else math.nan
        return cls(statistics.fmean(finite), sd, min(finite), max(finite), len(finite))

    def cell(self, digits: int = 3, signed: bool = False) -> str:
        if self.n == 0:
            return "-"
        sign = "+" if signed else ""
        sd = f" ± {self.sd:.{digits}f}" if math.isfinite(self.sd) else ""
        return f"{self.mean:{sign}.{digits}f}{sd} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}]"


def _mix_order(mix: str) -> tuple[int, int]:
    """Most local first: isolation (J = 0) leads and is the baseline of the paired comparison."""
    local, external = (int(part) for part in mix.split("/"))
    return -local, external


def by_mix(runs: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    """Runs per configuration, configurations from the most local to the most external."""
    out: dict[str, list[RunRecord]] = {}
    for run in sorted(runs, key=lambda r: (_mix_order(r.mix), r.seed)):
        out.setdefault(run.mix, []).append(run)
    return out


def paired_delta(runs: Sequence[RunRecord], baseline: Sequence[RunRecord], metric: str) -> list[float]:
    """metric(run) - metric(baseline run of the same seed), for the seeds both have."""
    base = {r.seed: run_metrics(r)[metric] for r in baseline}
    return [run_metrics(r)[metric] - base[r.seed] for r in runs if r.seed in base]


TABLE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("paper_total", "paper metric: batch reward, sum over nodes x rounds", 1),
    ("own_total", "on-policy reward, sum over nodes x rounds", 1),
    ("own_last", f"on-policy reward, last {LAST_ROUNDS} rounds (mean)", 3),
    ("heldout_after", "held-out reward after", 3),
    ("heldout_delta", "held-out change", 3),
    ("drawdown", "largest fall of the smoothed on-policy curve", 3),
)


def summary_table(runs: Sequence[RunRecord]) -> str:
    """Markdown: per configuration, each metric as mean ± sd [min, max] over seeds."""
    groups = by_mix(runs)
    head = "| I/J | seeds | " + " | ".join(label for _, label, _ in TABLE_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(TABLE_COLUMNS) + 2)]
    for mix, members in groups.items():
        metrics = [run_metrics(r) for r in members]
        cells = [
            Spread.of([m[key] for m in metrics]).cell(digits, signed=key == "heldout_delta")
            for key, _, digits in TABLE_COLUMNS
        ]
        lines.append(f"| {mix} | {len(members)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def delta_table(runs: Sequence[RunRecord]) -> str:
    """Markdown: each configuration minus isolation (the first configuration) on the same seed."""
    groups = by_mix(runs)
    mixes = list(groups)
    if len(mixes) < 2:
        return "(one configuration: nothing to compare)"
    base_mix = mixes[0]
    keys = ("paper_total", "own_total", "own_last", "heldout_after")
    lines = [
        f"| I/J vs {base_mix}, same seed | " + " | ".join(keys) + " | paper metric, relative |",
        "|" + "---|" * (len(keys) + 2),
    ]
    base_runs = groups[base_mix]
    for mix in mixes[1:]:
        cells = [Spread.of(paired_delta(groups[mix], base_runs, k)).cell(3, signed=True) for k in keys]
        base_total = {r.seed: run_metrics(r)["paper_total"] for r in base_runs}
        relative = [
            run_metrics(r)["paper_total"] / base_total[r.seed] - 1
            for r in groups[mix]
            if base_total.get(r.seed)
        ]
        lines.append(f"| {mix} | " + " | ".join(cells) + f" | {Spread.of(relative).cell(2, signed=True)} |")
    return "\n".join(lines)


def per_seed_table(runs: Sequence[RunRecord]) -> str:
    """Markdown: every run's headline numbers."""
    lines = [
        "| run | paper metric | on-policy sum | on-policy first→last | held-out before→after | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda r: (r.seed, _mix_order(r.mix))):
        m = run_metrics(run)
        lines.append(
            f"| {run.mix} seed {run.seed} | {m['paper_total']:.2f} | {m['own_total']:.2f} | "
            f"{m['own_first']:.3f} → {m['own_last']:.3f} | {m['heldout_before']:.3f} → "
            f"{m['heldout_after']:.3f} | {m['wall_seconds']:.0f} |"
        )
    return "\n".join(lines)


def _band(per_node: dict[str, list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Smoothed per node, then node mean and min-max band, round by round."""
    smoothed = [moving_average(v) for v in per_node.values()]
    length = min((len(v) for v in smoothed), default=0)
    columns = [[v[i] for v in smoothed] for i in range(length)]
    return [statistics.fmean(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def plot_curves(
    runs: Sequence[RunRecord], path: Path, field: Callable[[RunRecord], dict[str, list[float]]], title: str
) -> None:
    """One panel per configuration; per seed the node mean with its min-max band across nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_mix(runs)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), sharey=True, squeeze=False)
    for ax, (mix, members) in zip(axes[0], groups.items(), strict=True):
        for run in members:
            mean, low, high = _band(field(run))
            x = list(range(1, len(mean) + 1))
            (line,) = ax.plot(x, mean, label=f"seed {run.seed}")
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
        ax.set_title(f"I/J = {mix}")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"reward ({SMOOTH}-round mean)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_comparison(runs: Sequence[RunRecord], path: Path) -> None:
    """All configurations on one axis: mean over seeds of the node-mean curve, band = min-max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels: tuple[tuple[Callable[[RunRecord], dict[str, list[float]]], str], ...] = (
        (lambda r: r.own, "on-policy reward (own rounds)"),
        (lambda r: r.batch, "batch reward (paper's metric)"),
    )
    for ax, (field, title) in zip(axes, panels, strict=True):
        for mix, members in by_mix(runs).items():
            curves = [moving_average(swarm_curve(field(r))) for r in members]
            length = min(len(c) for c in curves)
            x = list(range(1, length + 1))
            mean = [statistics.fmean(c[i] for c in curves) for i in range(length)]
            (line,) = ax.plot(x, mean, label=f"{mix} ({len(members)} seeds)")
            ax.fill_between(
                x,
                [min(c[i] for c in curves) for i in range(length)],
                [max(c[i] for c in curves) for i in range(length)],
                color=line.get_color(),
                alpha=0.12,
            )
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"reward ({SMOOTH}-round mean)")
    axes[0].legend(fontsize=8, title="I/J")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_runs(out_dir: Path) -> list[RunRecord]:
    return [load_run(p.parent) for p in sorted((out_dir / "runs").glob(f"*/{RESULT}"))]


def write_report(out_dir: Path, header: str) -> Path:
    """report.md, summary.json and the plots, from every finished run under `out_dir/runs`."""
    runs = load_runs(out_dir)
    if not runs:
        raise FileNotFoundError(f"no finished runs under {out_dir / 'runs'}")
    plot_curves(
        runs,
        out_dir / "curves_own.png",
        lambda r: r.own,
        "on-policy reward per node (band: min-max over nodes)",
    )
    plot_curves(
        runs, out_dir / "curves_batch.png", lambda r: r.batch, "batch reward per node, the paper's metric"
    )
    plot_comparison(runs, out_dir / "comparison.png")
    summary: dict[str, Any] = {
        "runs": [{"mix": r.mix, "seed": r.seed, **run_metrics(r)} for r in runs],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    report = "\n\n".join(
        [
            header.rstrip(),
            "## Configurations (mean ± sd [min, max] over seeds)",
            summary_table(runs),
            "## Against isolation, seed by seed (paired: same initial model and streams)",
            delta_table(runs),
            "## Every run",
            per_seed_table(runs),
            "## Curves",
            "![all configurations](comparison.png)\n\n![on-policy reward](curves_own.png)\n\n"
            "![batch reward](curves_batch.png)",
        ]
    )
    path = out_dir / "report.md"
    path.write_text(report + "\n")
    return path
