"""`sapo report RUN_DIR`: who contributed what to each node's training, from a run's step records.

Every step row (`sapo.swarm.history`) carries the step's contributions: per source node the groups,
completions, completion tokens and advantage mass (sum of |advantage|) it trained on, the node's own
groups under its own id (`sapo.trainer.contributions`). This module adds them up per (training node,
source node) over the run and shows them as a table and a plot. Shares are of the training node's
totals, so a row reads "x% of node-a's trained tokens (signal) came from node-b".

The sampler's side travels in the same rows: each batch's `intake` (what the node's sampler received
from each peer since its previous batch, used, and rejected by reason), copied by the trainer into its
step metrics. `intake_totals` adds it up per (node, peer). Runs of `--in-process` swarms record no
intake (they have no sampler service).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rich import box
from rich.console import Console
from rich.table import Table

from sapo.swarm.history import STEPS_DIR, read_rows


@dataclass(frozen=True)
class PeerTotals:
    """What `source`'s groups put into `trainer`'s steps over a run; shares of `trainer`'s totals."""

    trainer: str
    source: str
    steps: int
    groups: int
    completions: int
    completion_tokens: int
    advantage_mass: float
    token_share: float
    mass_share: float

    @property
    def local(self) -> bool:
        return self.trainer == self.source


def contribution_totals(run_dir: Path) -> list[PeerTotals]:
    """Per training node (sorted) and source node (own groups first, then by advantage mass)."""
    totals: list[PeerTotals] = []
    for path in sorted((run_dir / STEPS_DIR).glob("*.jsonl")):
        trainer = path.stem
        sums: dict[str, list[float]] = {}
        for row in read_rows(path):
            for c in row.get("contributions", []):
                s = sums.setdefault(c["node"], [0, 0, 0, 0, 0.0])
                s[0] += 1
                s[1] += c["groups"]
                s[2] += c["completions"]
                s[3] += c["completion_tokens"]
                s[4] += c["advantage_mass"]
        tokens = sum(s[3] for s in sums.values())
        mass = math.fsum(s[4] for s in sums.values())
        found = [
            PeerTotals(
                trainer,
                source,
                int(s[0]),
                int(s[1]),
                int(s[2]),
                int(s[3]),
                s[4],
                s[3] / tokens if tokens else 0.0,
                s[4] / mass if mass else 0.0,
            )
            for source, s in sums.items()
        ]
        totals += sorted(found, key=lambda t: (not t.local, -t.advantage_mass, t.source))
    return totals


@dataclass
class IntakeTotals:
    """What `node`'s sampler did with `peer`'s swarm groups over a run."""

    node: str
    peer: str
    received: int = 0
    used: int = 0
    rejected: Counter[str] = field(default_factory=Counter)


def intake_totals(run_dir: Path) -> list[IntakeTotals]:
    """Per node (sorted) and peer (by groups received, most first)."""
    totals: list[IntakeTotals] = []
    for path in sorted((run_dir / STEPS_DIR).glob("*.jsonl")):
        sums: dict[str, IntakeTotals] = {}
        for row in read_rows(path):
            for i in row.get("intake", []):
                t = sums.setdefault(i["node"], IntakeTotals(path.stem, i["node"]))
                t.received += i["received"]
                t.used += i["used"]
                t.rejected.update(i["rejected"])
        totals += sorted(sums.values(), key=lambda t: (-t.received, t.peer))
    return totals


def print_intake(totals: Sequence[IntakeTotals], out: IO[str], reasons: int = 3) -> None:
    """One row per (node, peer): received, used, rejected, and the most frequent reasons."""
    table = Table(box=box.SIMPLE_HEAD, title="what each node's sampler did with its peers' groups")
    for name in ("node", "peer", "received", "used", "rejected"):
        table.add_column(name, justify="left" if name in ("node", "peer") else "right")
    table.add_column("top reasons")
    previous = None
    for t in totals:
        if previous is not None and t.node != previous:
            table.add_section()
        previous = t.node
        top = ", ".join(f"{reason} {n}" for reason, n in t.rejected.most_common(reasons))
        table.add_row(t.node, t.peer, str(t.received), str(t.used), str(t.rejected.total()), top)
    Console(file=out, width=120).print(table)


def print_table(totals: Sequence[PeerTotals], out: IO[str]) -> None:
    table = Table(box=box.SIMPLE_HEAD, title="contributions to each node's training (trained rows)")
    for name in ("trainer", "source", "steps", "groups", "completions", "tokens", "token share"):
        table.add_column(name, justify="left" if name in ("trainer", "source") else "right")
    table.add_column("adv. mass", justify="right")
    table.add_column("mass share", justify="right")
    previous = None
    for t in totals:
        if previous is not None and t.trainer != previous:
            table.add_section()
        previous = t.trainer
        table.add_row(
            t.trainer,
            f"{t.source} (own)" if t.local else t.source,
            str(t.steps),
            str(t.groups),
            str(t.completions),
            str(t.completion_tokens),
            f"{t.token_share:.1%}",
            f"{t.advantage_mass:.2f}",
            f"{t.mass_share:.1%}",
        )
    Console(file=out, width=120).print(table)


def plot(totals: Sequence[PeerTotals], path: Path) -> None:
    """Per training node, stacked bars of the share of its trained tokens and of its advantage mass
    that each source node supplied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trainers = list(dict.fromkeys(t.trainer for t in totals))
    sources = sorted({t.source for t in totals})
    share = {(t.trainer, t.source): (t.token_share, t.mass_share) for t in totals}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, index, title in (
        (axes[0], 0, "share of trained tokens"),
        (axes[1], 1, "share of advantage mass"),
    ):
        bottom = [0.0] * len(trainers)
        for source in sources:
            heights = [share.get((trainer, source), (0.0, 0.0))[index] for trainer in trainers]
            ax.bar(trainers, heights, bottom=bottom, label=source)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_title(title)
        ax.set_xlabel("training node")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    axes[1].legend(title="source node", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
