"""Does warm start help a late node? A paired, in-process measurement (`results/late-join`).

    python -m sapo.experiment.latejoin --out results/late-join --seeds 0 1 2 3 4 --before 20 --live 20
    python -m sapo.experiment.latejoin --out results/late-join --seeds 0 1 2 3 4 --report-only

Per seed, one in-process lock-step swarm (`sapo.swarm.inprocess`): `--peers` nodes of `--model` run
from round 0; at round `--before` two late nodes join, identical in everything (initial weights,
question stream, sampling and selection seeds) but warm start: `late-warm` trains on the swarm's
retained history first (`SAPO_SAMPLER_WARM_START__ENABLED`), `late-cold` does not (it takes the missed
rounds as empty steps, as lock-step needs). Both then run `--live` live rounds taking I/J groups from
the peers. The late nodes share nothing, so they change neither the peers nor each other: both see
the very same swarm, and their difference is warm start alone.

The reading is each late node's on-policy reward (every completion of its own round, the quantity the
other results' verdicts read) per live round; warm minus cold is paired by seed and live round, with
a Student t interval over seeds (`sapo.experiment.stats.paired_interval`). Reported: the first live
round (the warm start's own effect, before any live step), the last `--tail` live rounds (the reward
after the same number of live rounds), and every live round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sapo.experiment.stats import paired_interval
from sapo.swarm.history import ROUNDS_DIR, read_rows
from sapo.swarm.inprocess import InProcessSwarm
from sapo.swarm.manifest import SwarmManifest

ARMS = ("late-warm", "late-cold")


def manifest(seed: int, args: argparse.Namespace) -> SwarmManifest:
    """The swarm of one seed: the peers, then the two late nodes, equal but for warm start."""
    defaults: dict[str, Any] = {
        "model": args.model.format(seed=seed),
        "profile": "easy",
        "max_new_tokens": 24,
        "learning_rate": args.learning_rate,
        "local_groups": 4,
        "external_groups": 4,
        "sampler": {"lockstep_timeout_s": 120},
        "trainer": {"keep_last": 2},
    }
    rounds = args.before + args.live
    peers = [{"id": f"peer-{i + 1}", "seed": 1000 * seed + i, "rounds": rounds} for i in range(args.peers)]
    late = {"seed": 1000 * seed + 999, "rounds": rounds, "sharing": "none"}
    nodes = [
        *peers,
        {**late, "id": "late-warm", "sampler": {**defaults["sampler"], "warm_start": {"enabled": True}}},
        {**late, "id": "late-cold"},
    ]
    nodes = [{**defaults, **n} for n in nodes]
    return SwarmManifest.model_validate({"name": f"late-join-s{seed}", "nodes": nodes})


def live_rewards(run_dir: Path, node: str, first_round: int) -> list[float]:
    """The node's on-policy reward of each live round, in round order."""
    rows = read_rows(run_dir / ROUNDS_DIR / f"{node}.jsonl")
    return [r["reward_mean"] for r in sorted(rows, key=lambda r: r["round"]) if r["round"] >= first_round]


def run_seed(seed: int, args: argparse.Namespace) -> float:
    """Run one seed's swarm; its wall time in seconds."""
    started = time.perf_counter()
    with (args.out / "runs" / f"s{seed}.log").open("w") as log:
        swarm = InProcessSwarm(
            manifest(seed, args), _run_dir(seed, args), joins=dict.fromkeys(ARMS, args.before)
        )
        if swarm.run(out=log) != 0:
            raise SystemExit(f"seed {seed}: the swarm stopped early (see {log.name})")
    return time.perf_counter() - started


def collect(seed: int, args: argparse.Namespace, seconds: float | None) -> dict[str, Any]:
    """One seed's live-round rewards from its run record: each late node's, and the peers' mean
    over the same rounds (how far the late nodes are from the swarm they joined)."""
    run_dir = _run_dir(seed, args)
    peers = [live_rewards(run_dir, f"peer-{i + 1}", args.before) for i in range(args.peers)]
    return {
        "seed": seed,
        "seconds": seconds,
        **{arm: live_rewards(run_dir, arm, args.before) for arm in ARMS},
        "peers": [statistics.fmean(values) for values in zip(*peers, strict=True)],
    }


def _run_dir(seed: int, args: argparse.Namespace) -> Path:
    return Path(args.out) / "runs" / f"s{seed}"


def interval(runs: list[dict[str, Any]], rounds: slice) -> dict[str, float]:
    diffs = [
        [w - c for w, c in zip(r["late-warm"][rounds], r["late-cold"][rounds], strict=True)] for r in runs
    ]
    i = paired_interval(diffs)
    warm, cold, peers = (statistics.fmean(v for r in runs for v in r[k][rounds]) for k in (*ARMS, "peers"))
    return {"warm": warm, "cold": cold, "peers": peers, "delta": i.effect, "low": i.low, "high": i.high}


def report(runs: list[dict[str, Any]], args: argparse.Namespace, command: str) -> str:
    windows = {
        "first live round": slice(0, 1),
        f"last {args.tail} live rounds": slice(args.live - args.tail, args.live),
        f"all {args.live} live rounds": slice(0, args.live),
    }
    results = {name: interval(runs, s) for name, s in windows.items()}
    arguments = {k: str(v) for k, v in vars(args).items() if k != "report_only"}
    summary = {"command": command, "args": arguments, "results": results, "runs": runs}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [
        "# Late join: warm start against none",
        "",
        f"Command: `{command}`",
        "",
        f"{args.peers} peers of `{args.model}` for {args.before} lock-step rounds, then `late-warm` and "
        f"`late-cold` join for {args.live} live rounds; seeds {args.seeds}. On-policy reward of the late "
        "nodes' own rounds; Δ = warm − cold, paired by seed and round, 95% Student t over seeds.",
        "",
        "| live rounds | warm | cold | Δ warm − cold [95%] | peers (same rounds) |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {r['warm']:.3f} | {r['cold']:.3f} | {r['delta']:+.3f} "
            f"[{r['low']:+.3f}, {r['high']:+.3f}] | {r['peers']:.3f} |"
            for name, r in results.items()
        ),
        "",
        "Per live round (mean over seeds; `curves.png`):",
        "",
        "| live round | warm | cold | peers |",
        "|---|---|---|---|",
        *(
            f"| {k + 1} | " + " | ".join(f"{_mean_at(runs, key, k):.3f}" for key in (*ARMS, "peers")) + " |"
            for k in range(args.live)
        ),
        "",
        "Wall time per seed: "
        + ", ".join(f"s{r['seed']} {r['seconds'] / 60:.1f} min" for r in runs if r["seconds"] is not None),
        "",
    ]
    plot(runs, args, args.out / "curves.png")
    text = "\n".join(lines)
    (args.out / "report.md").write_text(text)
    return text


def _mean_at(runs: list[dict[str, Any]], key: str, k: int) -> float:
    return statistics.fmean(r[key][k] for r in runs)


def plot(runs: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    """The mean over seeds of each late node's and the peers' reward per live round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    x = list(range(1, args.live + 1))
    for key, label in (
        ("late-warm", "late node, warm start"),
        ("late-cold", "late node, none"),
        ("peers", "peers"),
    ):
        ax.plot(x, [_mean_at(runs, key, k) for k in range(args.live)], label=label)
    ax.set_xlabel(f"live round (swarm round - {args.before})")
    ax.set_ylabel(f"on-policy reward (mean of {len(runs)} seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="Result directory (runs/ is made there).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--peers", type=int, default=4, help="Nodes that run from round 0.")
    parser.add_argument("--before", type=int, default=20, help="Rounds before the late nodes join.")
    parser.add_argument("--live", type=int, default=20, help="Live rounds of the late nodes.")
    parser.add_argument("--tail", type=int, default=5, help="Live rounds at the end that are read.")
    parser.add_argument("--model", default="warm-bpe:{seed}", help="Model of every node ({seed} filled).")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--report-only", action="store_true", help="Re-read the runs of --out; run nothing.")
    args = parser.parse_args(argv)
    if not 1 <= args.tail <= args.live or args.before < 1:
        parser.error("need --before >= 1 and 1 <= --tail <= --live")
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    command = "python -m sapo.experiment.latejoin " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.report_only:
        previous = json.loads((args.out / "summary.json").read_text())
        seconds = {r["seed"]: r["seconds"] for r in previous["runs"]}
        command = previous.get("command", command)
        runs = [collect(seed, args, seconds.get(seed)) for seed in args.seeds]
    else:
        runs = [collect(seed, args, run_seed(seed, args)) for seed in args.seeds]
    sys.stdout.write(report(runs, args, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
