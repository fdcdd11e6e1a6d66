"""From an experiment's run directories to numbers, a markdown report and reward-curve plots.

Per node and round (round r is trained as policy version r + 1, so rounds and steps line up by index):
- on-policy reward (`own`): the mean over every completion the node sampled in the round, before any
  filter: how good the node's policy is. The headline metric.
- paper metric (`batch`): the mean reward of the node's training batch, summed over nodes and rounds as
  the paper reports it (its external groups are filtered for signal, and so are our local ones).
- reference-style metric (`reference`): the batch mean reward the public reference code would have
  counted for the same round: its I local slots filled from *all* of the node's own groups of the round
  (the reference kept zero-advantage local groups; a uniform draw of I of them has the round's on-policy
  mean in expectation) and its external part the batch's actual external groups, which the reference
  filtered as we do:
      reference = (I * L * own + E * external_mean) / (I * L + E)
  with I the configured local groups, L the completions per question, E the external completions the
  batch trained and external_mean their mean reward (from the step's reward, local reward and counts).
  Summed over nodes and rounds like the paper metric. NaN for records without the counts.
- held-out reward before and after (`sapo.experiment.evaluate`), per node; for a node that samples only
  some of the held-out tasks (a data silo) also `transfer`: its held-out reward on the tasks it never
  samples.

Across seeds a configuration is shown as mean ± sd [min, max]. Configurations are compared in pairs
(`Scenario.comparisons`, each against the baseline by default) by their per-round paired differences
with a 95% interval (`sapo.experiment.stats`), for the whole swarm and, when the scenario has node
groups, for each group. Runs made with `--confirm` (one configuration through the Kafka services) are
compared with the in-process run of the same configuration and seed.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo.experiment.plan import group_of, parse_mix
from sapo.experiment.stats import Interval, paired_interval
from sapo.generator.settings import GeneratorSettings
from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, own_round_rewards, read_rows
from sapo.tasks import load_profile

SMOOTH = 5
"""Rounds in the moving average of the curves and the drawdown (8 questions make one round noisy)."""
LAST_ROUNDS = 5
RESULT = "result.json"
ALL = "all"
"""The node group that stands for every node of the swarm."""


@dataclass(frozen=True)
class Heldout:
    """One policy's held-out evaluation: the mean, and per question its mean reward and task."""

    reward_mean: float
    per_question: tuple[float, ...] = ()
    tasks: tuple[str, ...] = ()

    @classmethod
    def of(cls, data: dict[str, Any]) -> Heldout:
        return cls(
            float(data["reward_mean"]),
            tuple(data.get("per_question", ())),
            tuple(data.get("question_tasks", ())),
        )

    def mean_over(self, tasks: frozenset[str] | None) -> float:
        """Mean over the questions of `tasks` (all when None); NaN without per-question data."""
        if tasks is None:
            return self.reward_mean
        values = [v for v, t in zip(self.per_question, self.tasks, strict=True) if t in tasks]
        return statistics.fmean(values) if values else math.nan


@dataclass(frozen=True)
class RunRecord:
    """One finished run: per node its per-round curves, held-out results, group and sampled tasks."""

    config: str
    seed: int
    mode: str
    wall_seconds: float
    own: dict[str, list[float]]
    batch: dict[str, list[float]]
    reference: dict[str, list[float]]
    heldout_before: dict[str, Heldout]
    heldout_after: dict[str, Heldout]
    groups: dict[str, str]
    sampled_tasks: dict[str, frozenset[str]] = field(default_factory=dict)
    """Tasks each node samples, for nodes that sample fewer than the held-out set covers."""
    confirmation: bool = False

    @property
    def nodes(self) -> list[str]:
        return sorted(self.own)

    def members(self, group: str) -> list[str]:
        return [n for n in self.nodes if group in (ALL, self.groups[n])]

    def other_tasks(self, node: str) -> frozenset[str] | None:
        """The held-out tasks the node never samples; None when it samples them all."""
        sampled = self.sampled_tasks.get(node)
        if sampled is None:
            return None
        return frozenset(self.heldout_after[node].tasks) - sampled


def _reference_curve(rounds: list[float], steps: list[dict[str, Any]], local: int, per_q: int) -> list[float]:
    """The reference-style batch mean per round (module docstring); NaN where a step lacks counts."""
    out: list[float] = []
    for own, step in zip(rounds, steps, strict=False):
        n_local, n_ext = step.get("local_completions"), step.get("external_completions")
        if n_local is None or n_ext is None:
            out.append(math.nan)
            continue
        slots = local * per_q
        if n_ext == 0:
            out.append(own if slots else math.nan)
            continue
        total = step["reward_mean"] * (n_local + n_ext)
        external_mean = (total - step["local_reward_mean"] * n_local) / n_ext
        out.append((slots * own + n_ext * external_mean) / (slots + n_ext))
    return out


def _sampled_tasks(manifest: dict[str, Any], heldout_profile: str | None) -> dict[str, frozenset[str]]:
    """Nodes whose task profile is narrower than the held-out profile, with the tasks they sample."""
    if heldout_profile is None:
        return {}
    heldout = {spec.name for spec in load_profile(heldout_profile)}
    out: dict[str, frozenset[str]] = {}
    for node in manifest.get("nodes", []):
        tasks = frozenset(spec.name for spec in load_profile(node["profile"]))
        if heldout - tasks:
            out[node["id"]] = tasks
    return out


_DEFAULT_COMPLETIONS: int = GeneratorSettings.model_fields["completions_per_question"].default


def load_run(run_dir: Path, heldout_profile: str | None = None) -> RunRecord:
    """A run's record. Records of earlier versions (one shared held-out baseline, no node groups, no
    step counts) load too: their reference-style metric is NaN."""
    result = json.loads((run_dir / RESULT).read_text())
    manifest_path = run_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    specs = {n["id"]: n for n in manifest.get("nodes", [])}
    nodes: list[str] = result["nodes"]
    own, batch, reference = {}, {}, {}
    for n in nodes:
        spec = specs.get(n, {})
        rows = read_rows(run_dir / ROUNDS_DIR / f"{n}.jsonl")
        rounds = own_round_rewards(rows, int(spec.get("rounds") or len(rows)))
        steps = sorted(read_rows(run_dir / STEPS_DIR / f"{n}.jsonl"), key=lambda s: s["version"])
        own[n], batch[n] = rounds, [s["reward_mean"] for s in steps]
        mix = parse_mix(result.get("mix", "")) or (0, 0)
        # A manifest records a short key left to its service's default as null.
        local = spec.get("local_groups")
        completions = spec.get("completions_per_question")
        reference[n] = _reference_curve(
            rounds,
            steps,
            mix[0] if local is None else int(local),
            _DEFAULT_COMPLETIONS if completions is None else int(completions),
        )
    before = result["heldout_before"]
    shared = "reward_mean" in before  # earlier records: one evaluation of the common initial model
    return RunRecord(
        config=result.get("config", result.get("mix", "?")),
        seed=int(result["seed"]),
        mode=result.get("mode", "services"),
        wall_seconds=float(result["wall_seconds"]),
        own=own,
        batch=batch,
        reference=reference,
        heldout_before={n: Heldout.of(before if shared else before[n]) for n in nodes},
        heldout_after={n: Heldout.of(e) for n, e in result["heldout_after"].items()},
        groups=result.get("groups") or {n: group_of(n) for n in nodes},
        sampled_tasks=_sampled_tasks(manifest, heldout_profile) if manifest else {},
        confirmation=bool(result.get("confirmation", False)),
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


def swarm_curve(per_node: dict[str, list[float]], nodes: Sequence[str] | None = None) -> list[float]:
    """Mean over the nodes (all, or those given), round by round, over the rounds every one has."""
    chosen = [per_node[n] for n in (nodes if nodes is not None else sorted(per_node))]
    length = min((len(v) for v in chosen), default=0)
    return [statistics.fmean(v[i] for v in chosen) for i in range(length)]


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def _total(per_node: dict[str, list[float]], nodes: Sequence[str]) -> float:
    values = [v for n in nodes for v in per_node[n]]
    return math.fsum(values) if values and all(math.isfinite(v) for v in values) else math.nan


def run_metrics(run: RunRecord, group: str = ALL) -> dict[str, float]:
    """The run's metrics over one node group (ALL: the swarm)."""
    nodes = run.members(group)
    own_curve = swarm_curve(run.own, nodes)
    after = [run.heldout_after[n].reward_mean for n in nodes if n in run.heldout_after]
    before = [run.heldout_before[n].reward_mean for n in nodes if n in run.heldout_before]
    transfer = [
        run.heldout_after[n].mean_over(run.other_tasks(n)) for n in nodes if run.other_tasks(n) is not None
    ]
    transfer_before = [
        run.heldout_before[n].mean_over(run.other_tasks(n)) for n in nodes if run.other_tasks(n) is not None
    ]
    return {
        "own_mean": _mean([v for n in nodes for v in run.own[n]]),
        "own_total": _total(run.own, nodes),
        "own_first": statistics.fmean(own_curve[:LAST_ROUNDS]) if own_curve else math.nan,
        "own_last": statistics.fmean(own_curve[-LAST_ROUNDS:]) if own_curve else math.nan,
        "paper_total": _total(run.batch, nodes),
        "reference_total": _total(run.reference, nodes),
        "heldout_before": _mean(before),
        "heldout_after": _mean(after),
        "heldout_delta": _mean(after) - _mean(before),
        "transfer_before": _mean(transfer_before),
        "transfer_after": _mean(transfer),
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
        if self.n == 1:
            return f"{self.mean:{sign}.{digits}f}"
        sd = f" ± {self.sd:.{digits}f}" if math.isfinite(self.sd) else ""
        return f"{self.mean:{sign}.{digits}f}{sd} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}]"


def _mix_order(config: str) -> tuple[int, int]:
    """Records without a scenario order: most local first, so isolation (J = 0) leads."""
    mix = parse_mix(config)
    return (-mix[0], mix[1]) if mix else (1, 0)


def by_config(runs: Sequence[RunRecord], order: Sequence[str] = ()) -> dict[str, list[RunRecord]]:
    """Runs per configuration, in the scenario's order (else from the most local to the most external)."""
    rank = {name: i for i, name in enumerate(order)}
    out: dict[str, list[RunRecord]] = {}

    def key(r: RunRecord) -> tuple[Any, ...]:
        return (rank.get(r.config, len(rank)), _mix_order(r.config), r.seed)

    for run in sorted(runs, key=key):
        out.setdefault(run.config, []).append(run)
    return out


def node_groups(runs: Sequence[RunRecord]) -> list[str]:
    """ALL, then each node group when there is more than one."""
    names = sorted({g for r in runs for g in r.groups.values()})
    return [ALL, *names] if len(names) > 1 else [ALL]


# --- paired comparisons -----------------------------------------------------------------------------


CurveOf = Callable[[RunRecord], dict[str, list[float]]]
CURVES: dict[str, CurveOf] = {
    "own": lambda r: r.own,
    "paper": lambda r: r.batch,
    "reference": lambda r: r.reference,
}


def paired_by_seed(
    a_runs: Sequence[RunRecord], b_runs: Sequence[RunRecord]
) -> list[tuple[RunRecord, RunRecord]]:
    """(A's run, B's run) of every seed both have, in A's order."""
    base = {r.seed: r for r in b_runs}
    return [(run, base[run.seed]) for run in a_runs if run.seed in base]


def round_differences(
    a_runs: Sequence[RunRecord], b_runs: Sequence[RunRecord], curve: CurveOf, group: str = ALL
) -> list[list[float]]:
    """Per seed both have: the per-round difference of the group's node-mean curve (A minus B)."""
    out = []
    for run, other in paired_by_seed(a_runs, b_runs):
        a = swarm_curve(curve(run), run.members(group))
        b = swarm_curve(curve(other), other.members(group))
        out.append([x - y for x, y in zip(a, b, strict=False)])
    return out


def heldout_differences(
    a_runs: Sequence[RunRecord], b_runs: Sequence[RunRecord], group: str = ALL, *, transfer: bool = False
) -> list[list[float]]:
    """Per seed both have, per held-out question: the node-mean of A's reward minus B's on it (with
    `transfer`, each node counts only on the tasks it never samples)."""
    out = []
    for run, other in paired_by_seed(a_runs, b_runs):
        per_question: dict[int, list[float]] = {}
        for node in run.members(group):
            a, b = run.heldout_after.get(node), other.heldout_after.get(node)
            if a is None or b is None or len(a.per_question) != len(b.per_question):
                continue
            skip = run.other_tasks(node)
            if transfer and skip is None:
                continue
            for i, (x, y) in enumerate(zip(a.per_question, b.per_question, strict=True)):
                if not transfer or (skip is not None and a.tasks[i] in skip):
                    per_question.setdefault(i, []).append(x - y)
        out.append([statistics.fmean(v) for _, v in sorted(per_question.items())])
    return out


@dataclass(frozen=True)
class Comparison:
    """A vs B over one node group: each metric's paired effect and interval, and the baseline level."""

    a: str
    b: str
    group: str
    seeds: int
    own: Interval
    paper: Interval
    reference: Interval
    heldout: Interval
    transfer: Interval
    own_level: float
    paper_level: float
    reference_level: float
    own_per_seed: tuple[float, ...]

    def relative(self, metric: str) -> float:
        """The effect as a fraction of B's mean per node-round."""
        interval: Interval = getattr(self, metric)
        level: float = getattr(self, f"{metric}_level")
        return interval.effect / level if level else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "group": self.group,
            "seeds": self.seeds,
            "own": self.own.as_dict(),
            "paper": self.paper.as_dict(),
            "reference": self.reference.as_dict(),
            "heldout": self.heldout.as_dict(),
            "transfer": self.transfer.as_dict(),
            "own_relative": self.relative("own"),
            "paper_relative": self.relative("paper"),
            "reference_relative": self.relative("reference"),
            "own_per_seed": list(self.own_per_seed),
        }


def compare(
    a_runs: Sequence[RunRecord], b_runs: Sequence[RunRecord], a: str, b: str, group: str
) -> Comparison:
    def level(curve: CurveOf) -> float:
        seeds = {r.seed for r in a_runs}
        values = [v for r in b_runs if r.seed in seeds for v in swarm_curve(curve(r), r.members(group))]
        return _mean(values)

    own = round_differences(a_runs, b_runs, CURVES["own"], group)
    return Comparison(
        a=a,
        b=b,
        group=group,
        seeds=len(own),
        own=paired_interval(own),
        paper=paired_interval(round_differences(a_runs, b_runs, CURVES["paper"], group)),
        reference=paired_interval(round_differences(a_runs, b_runs, CURVES["reference"], group)),
        heldout=paired_interval(heldout_differences(a_runs, b_runs, group), block=1),
        transfer=paired_interval(heldout_differences(a_runs, b_runs, group, transfer=True), block=1),
        own_level=level(CURVES["own"]),
        paper_level=level(CURVES["paper"]),
        reference_level=level(CURVES["reference"]),
        own_per_seed=tuple(_mean(d) for d in own),
    )


def comparisons(
    runs: Sequence[RunRecord], pairs: Sequence[tuple[str, str]], order: Sequence[str] = ()
) -> list[Comparison]:
    """Every pair (A vs B) present in `runs`, for the swarm and each node group."""
    groups = by_config([r for r in runs if not r.confirmation], order)
    if not pairs:  # records without a scenario: every configuration against the first
        names = list(groups)
        pairs = [(name, names[0]) for name in names[1:]]
    return [
        compare(groups[a], groups[b], a, b, group)
        for a, b in pairs
        if a in groups and b in groups
        for group in node_groups(runs)
    ]


def confirmations(runs: Sequence[RunRecord]) -> list[tuple[RunRecord, RunRecord, Interval]]:
    """Each services confirmation run, the in-process run of its configuration and seed, and their
    paired per-round difference of the swarm's on-policy reward (services minus in-process)."""
    inprocess = {(r.config, r.seed): r for r in runs if not r.confirmation}
    out = []
    for run in runs:
        twin = inprocess.get((run.config, run.seed)) if run.confirmation else None
        if twin is not None:
            out.append((run, twin, paired_interval(round_differences([run], [twin], CURVES["own"]))))
    return out


# --- tables ------------------------------------------------------------------------------------------

TABLE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("own_mean", "on-policy reward (mean per node-round)", 3),
    ("own_last", f"on-policy reward, last {LAST_ROUNDS} rounds", 3),
    ("paper_total", "paper metric (batch reward, sum over node-rounds)", 1),
    ("reference_total", "reference-style metric (sum over node-rounds)", 1),
    ("heldout_after", "held-out reward after", 3),
    ("heldout_delta", "held-out change", 3),
    ("transfer_after", "held-out on never-sampled tasks, after", 3),
    ("drawdown", "largest fall of the smoothed on-policy curve", 3),
)


def summary_table(runs: Sequence[RunRecord], order: Sequence[str] = ()) -> str:
    """Markdown: per configuration (and node group), each metric as mean ± sd [min, max] over seeds."""
    groups = node_groups(runs)
    metrics_runs = [r for r in runs if not r.confirmation]
    columns = [c for c in TABLE_COLUMNS if any(math.isfinite(run_metrics(r)[c[0]]) for r in metrics_runs)]
    head = "| configuration | nodes | seeds | " + " | ".join(label for _, label, _ in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 3)]
    for config, members in by_config(metrics_runs, order).items():
        for group in groups:
            metrics = [run_metrics(r, group) for r in members]
            cells = [
                Spread.of([m[key] for m in metrics]).cell(digits, signed=key == "heldout_delta")
                for key, _, digits in columns
            ]
            lines.append(f"| {config} | {group} | {len(members)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparison_table(found: Sequence[Comparison]) -> str:
    """Markdown: per comparison and node group, the paired effects with their 95% intervals."""
    if not found:
        return "(one configuration: nothing to compare)"
    lines = [
        "| A vs B | nodes | seeds | on-policy Δ per node-round [95%] | relative | verdict | "
        "on-policy Δ per seed | paper metric Δ [95%] | relative | reference-style Δ [95%] | relative | "
        "held-out Δ [95%] | never-sampled tasks Δ [95%] |",
        "|" + "---|" * 13,
    ]
    for c in found:
        per_seed = ", ".join(f"{v:+.3f}" for v in c.own_per_seed)
        lines.append(
            f"| {c.a} vs {c.b} | {c.group} | {c.seeds} | {c.own.cell()} | {_pct(c.relative('own'))} | "
            f"{c.own.verdict} | {per_seed} | {c.paper.cell()} | {_pct(c.relative('paper'))} | "
            f"{c.reference.cell()} | {_pct(c.relative('reference'))} | {c.heldout.cell()} | "
            f"{c.transfer.cell()} |"
        )
    return "\n".join(lines)


def _pct(value: float) -> str:
    return f"{100 * value:+.1f}%" if math.isfinite(value) else "-"


def per_run_table(runs: Sequence[RunRecord], order: Sequence[str] = ()) -> str:
    """Markdown: every run's headline numbers."""
    lines = [
        "| run | mode | on-policy mean | on-policy first→last | paper metric | reference-style | "
        "held-out before→after | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rank = {name: i for i, name in enumerate(order)}
    for run in sorted(runs, key=lambda r: (r.seed, rank.get(r.config, 99), r.config, r.confirmation)):
        m = run_metrics(run)
        lines.append(
            f"| {run.config} seed {run.seed} | {run.mode} | {m['own_mean']:.3f} | {m['own_first']:.3f} → "
            f"{m['own_last']:.3f} | {m['paper_total']:.2f} | {m['reference_total']:.2f} | "
            f"{m['heldout_before']:.3f} → {m['heldout_after']:.3f} | {m['wall_seconds']:.0f} |"
        )
    return "\n".join(lines)


def confirmation_table(found: Sequence[tuple[RunRecord, RunRecord, Interval]]) -> str:
    lines = [
        "| configuration, seed | on-policy mean: services / in-process | services − in-process per round "
        "[95%] | held-out after: services / in-process | wall s: services / in-process |",
        "|---|---|---|---|---|",
    ]
    for services, inprocess, interval in found:
        s, i = run_metrics(services), run_metrics(inprocess)
        lines.append(
            f"| {services.config}, seed {services.seed} | {s['own_mean']:.3f} / {i['own_mean']:.3f} | "
            f"{interval.cell()} | {s['heldout_after']:.3f} / {i['heldout_after']:.3f} | "
            f"{s['wall_seconds']:.0f} / {i['wall_seconds']:.0f} |"
        )
    return "\n".join(lines)


# --- plots -------------------------------------------------------------------------------------------


def _band(per_node: dict[str, list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Smoothed per node, then node mean and min-max band, round by round."""
    smoothed = [moving_average(v) for v in per_node.values()]
    length = min((len(v) for v in smoothed), default=0)
    columns = [[v[i] for v in smoothed] for i in range(length)]
    return [statistics.fmean(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def plot_curves(
    runs: Sequence[RunRecord], path: Path, curve: CurveOf, title: str, order: Sequence[str] = ()
) -> None:
    """One panel per configuration; per seed the node mean with its min-max band across nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_config(runs, order)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), sharey=True, squeeze=False)
    for ax, (config, members) in zip(axes[0], groups.items(), strict=True):
        for run in members:
            mean, low, high = _band(curve(run))
            x = list(range(1, len(mean) + 1))
            (line,) = ax.plot(x, mean, label=f"seed {run.seed}")
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
        ax.set_title(config)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"reward ({SMOOTH}-round mean)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_comparison(runs: Sequence[RunRecord], path: Path, order: Sequence[str] = ()) -> None:
    """All configurations on one axis per metric: mean over seeds of the node-mean curve, band =
    min-max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("own", "on-policy reward"), ("paper", "paper metric"), ("reference", "reference-style metric"))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 3.8))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for config, members in by_config(runs, order).items():
            curves = [moving_average(swarm_curve(CURVES[key](r))) for r in members]
            length = min(len(c) for c in curves)
            x = list(range(1, length + 1))
            mean = [statistics.fmean(c[i] for c in curves) for i in range(length)]
            (line,) = ax.plot(x, mean, label=f"{config} ({len(members)} seeds)")
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
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the report --------------------------------------------------------------------------------------


def load_runs(out_dir: Path, heldout_profile: str | None = None) -> list[RunRecord]:
    return [load_run(p.parent, heldout_profile) for p in sorted((out_dir / "runs").glob(f"*/{RESULT}"))]


METRICS_NOTE = """\
- on-policy reward: each node's mean over every completion it sampled in a round (no filter).
- paper metric: each training batch's mean reward (external and local groups filtered for signal),
  summed over nodes and rounds.
- reference-style metric: the batch mean the public reference code would have counted: its I local
  slots drawn from all of the node's own groups of the round, zero-advantage ones included (expected
  value: the round's on-policy mean), plus the batch's filtered external groups:
  (I·L·own + E·external mean) / (I·L + E), summed over nodes and rounds.
- Δ: configuration A minus B, paired by seed and round (both runs of a seed start from the same
  weights and question streams), node-mean per round, averaged over rounds, then over seeds; relative
  = Δ over B's mean. 95% interval: with two seeds or more, Student t over the per-seed mean
  differences (seeds are the replicates: rounds of one run are not independent); with one seed, a
  block bootstrap over its rounds (blocks of 5), which covers that run's round-to-round noise only,
  not seed-to-seed variation. Held-out Δ: paired per question; t over seeds, or with one seed a
  bootstrap over questions. "better"/"worse": the interval excludes 0."""


def write_report(
    out_dir: Path,
    header: str,
    *,
    order: Sequence[str] = (),
    pairs: Sequence[tuple[str, str]] = (),
    heldout_profile: str | None = None,
) -> Path:
    """report.md, summary.json and the plots, from every finished run under `out_dir/runs`."""
    runs = load_runs(out_dir, heldout_profile)
    if not runs:
        raise FileNotFoundError(f"no finished runs under {out_dir / 'runs'}")
    main = [r for r in runs if not r.confirmation]
    found = comparisons(main, pairs, order)
    checks = confirmations(runs)
    if main:
        plot_curves(main, out_dir / "curves_own.png", CURVES["own"], "on-policy reward per node", order)
        plot_comparison(main, out_dir / "comparison.png", order)
    summary: dict[str, Any] = {
        "runs": [
            {"config": r.config, "seed": r.seed, "mode": r.mode, "confirmation": r.confirmation}
            | run_metrics(r)
            for r in runs
        ],
        "comparisons": [c.as_dict() for c in found],
        "confirmations": [
            {"config": s.config, "seed": s.seed, **i.as_dict(), "wall_services": s.wall_seconds}
            for s, _, i in checks
        ],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    parts = [
        header.rstrip(),
        "## Comparisons (paired by seed and round)",
        comparison_table(found),
        METRICS_NOTE,
        "## Configurations (mean ± sd [min, max] over seeds)",
        summary_table(main, order),
    ]
    if checks:
        parts += ["## Confirmation through the Kafka services", confirmation_table(checks)]
    parts += [
        "## Every run",
        per_run_table(runs, order),
        "## Curves",
        "![all configurations](comparison.png)\n\n![on-policy reward per node](curves_own.png)",
    ]
    path = out_dir / "report.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path
