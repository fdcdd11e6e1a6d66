r"""Rounds per hour, fully async vs lock-step, through the real services on this machine.

Two runs of `sapo.swarm.run.run_swarm` on the same manifest except the round mode: `lockstep` (round r
is generated with policy version r; the sampler waits for the whole round) and `async` (the
trainer plans rounds up to --max-ahead versions ahead of training; the sampler emits a batch as soon
as I local and J external groups are pooled, J at most what the other nodes can give under the
per-source quota). `sapo.swarm.manifest.service_values` maps the manifest's `round_mode` onto the
sampler and the trainer.

A round here is one policy version: one GRPO step on one batch of I + J groups (in lock-step that is
exactly one generation round; in async a generation round may feed more or fewer batches than one).
Generation alone is reported next to it: rounds of B x L completions sampled per hour, same window
definition on the rounds' completion times.
Window, the same in both modes: per node, from the wall-clock `created_at` of the step row of version
1 to that of the node's last version, so start-up (broker, group joins, model loads) and round 0 are
left out; rounds per hour = (last version - 1) / window * 3600, averaged over nodes. The order of the
two runs alternates with --repeats and medians are compared.

Each run is capped at --max-seconds (then stopped as Ctrl-C would stop it; what was recorded still
counts), so a stalled swarm ends the benchmark instead of hanging it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_rounds.py [--model warm:0] [--nodes 4] [--rounds 10]

Target: async / lock-step >= 1.3. A quick check of the script itself (a random tiny model has no
reward signal: its batches are empty, but versions still advance in both modes):

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_rounds.py --model tiny:0 --nodes 2 --rounds 2 \
        --max-seconds 60

What it read at 4 and 2 nodes: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from sapo.experiment.plan import load_scenario, manifest_data, select
from sapo.swarm.history import ROUNDS_DIR, STEPS_DIR, read_rows
from sapo.swarm.manifest import SwarmManifest, parse_manifest
from sapo.swarm.run import run_swarm

TARGET_RATIO = 1.3
MODES = ("lockstep", "async")


def bench_manifest(model: str, nodes: int, rounds: int, mode: str, max_ahead: int) -> SwarmManifest:
    """The CPU experiment's swarm (`sapo experiment --scenario cpu`) at I/J 4/4, seed 0, in `mode`."""
    overrides: dict[str, object] = {"rounds": rounds, "model": model, "round_mode": mode}
    if mode == "async":
        overrides["trainer.max_ahead"] = max_ahead  # the trainer plans the rounds (`sapo.node.planner`)
    scenario = select(load_scenario("cpu"), nodes=nodes, overrides=overrides)
    return parse_manifest(manifest_data(scenario, "4/4", seed=0) | {"name": f"bench-rounds-{mode}"})


def rounds_per_hour(run_dir: Path, manifest: SwarmManifest) -> float | None:
    """Mean over nodes of (last version - 1) / (t[last] - t[version 1]) * 3600; None when some node
    trained fewer than two versions (no window)."""
    rates = []
    for node in manifest.nodes:
        rows = sorted(read_rows(run_dir / STEPS_DIR / f"{node.id}.jsonl"), key=lambda r: r["version"])
        if len(rows) < 2 or rows[0]["version"] != 1:
            return None
        window = rows[-1]["created_at"] - rows[0]["created_at"]
        rates.append((rows[-1]["version"] - 1) / window * 3600)
    return statistics.fmean(rates)


def generated_per_hour(run_dir: Path, manifest: SwarmManifest) -> float | None:
    """The same window on generation: mean over nodes of rounds completed per hour between the end of
    the node's first and last generated round; None when some node generated fewer than two."""
    rates = []
    for node in manifest.nodes:
        rows = sorted(read_rows(run_dir / ROUNDS_DIR / f"{node.id}.jsonl"), key=lambda r: r["round"])
        if len(rows) < 2:
            return None
        rates.append((len(rows) - 1) / (rows[-1]["completed_at"] - rows[0]["completed_at"]) * 3600)
    return statistics.fmean(rates)


def run_capped(manifest: SwarmManifest, run_dir: Path, max_seconds: float) -> int:
    """run_swarm, stopped as by Ctrl-C after max_seconds; its output goes to run_dir/run.log."""
    run_dir.mkdir(parents=True)
    out = io.StringIO()
    timer = threading.Timer(max_seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        return run_swarm(manifest, run_dir, refresh_s=0.5, out=out)
    finally:
        timer.cancel()
        (run_dir / "run.log").write_text(out.getvalue())


def measure(
    mode: str, manifest: SwarmManifest, run_dir: Path, max_seconds: float
) -> tuple[float | None, float | None]:
    started = time.monotonic()
    code = run_capped(manifest, run_dir, max_seconds)
    wall = time.monotonic() - started
    if code not in (0, 130):
        raise SystemExit(f"{mode} run failed with exit status {code}; see {run_dir / 'run.log'}")
    rate, generated_rate = rounds_per_hour(run_dir, manifest), generated_per_hour(run_dir, manifest)
    versions = {n.id: len(read_rows(run_dir / STEPS_DIR / f"{n.id}.jsonl")) for n in manifest.nodes}
    generated = {n.id: len(read_rows(run_dir / ROUNDS_DIR / f"{n.id}.jsonl")) for n in manifest.nodes}
    capped = " (stopped at --max-seconds)" if code == 130 else ""
    shown = f"{rate:8.0f} rounds/h" if rate is not None else "  no window (< 2 versions on some node)"
    made = f"{generated_rate:.0f} generated/h" if generated_rate is not None else "-"
    print(
        f"  {mode:<9} {shown} ({made})   versions {versions}   generated rounds {generated}"
        f"   {wall:.0f} s wall{capped}",
        flush=True,
    )
    return rate, generated_rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="warm:0", help="model ref of every node (default warm:0)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes, seeds 1..N (default 4)")
    parser.add_argument("--rounds", type=int, default=10, help="policy versions to train, >= 2 (default 10)")
    parser.add_argument("--max-ahead", type=int, default=1, help="async staleness bound (default 1)")
    parser.add_argument("--max-seconds", type=float, default=1800, help="cap per run (default 1800)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode, alternating (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the run directories under this directory")
    args = parser.parse_args()
    if args.rounds < 2 or args.nodes < 1 or args.repeats < 1 or args.max_ahead < 1:
        parser.error("--rounds must be >= 2 (the window spans versions 1..last); the others >= 1")
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    made: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-rounds-") as tmp:
        root = args.keep or Path(tmp)
        print(
            f"{args.nodes} nodes of {args.model}, 8x8 a round, I/J 4/4, 24 new tokens, {args.rounds} rounds"
        )
        for repeat in range(args.repeats):
            order = MODES if repeat % 2 == 0 else tuple(reversed(MODES))
            print(f"repeat {repeat + 1}/{args.repeats}:")
            for mode in order:
                manifest = bench_manifest(args.model, args.nodes, args.rounds, mode, args.max_ahead)
                rate, generated_rate = measure(mode, manifest, root / f"{mode}-{repeat}", args.max_seconds)
                if rate is not None:
                    rates[mode].append(rate)
                if generated_rate is not None:
                    made[mode].append(generated_rate)
    if not rates["lockstep"] or not rates["async"]:
        print("\nno ratio: a mode completed fewer than two versions on some node (see above)")
        return 1
    lockstep, async_ = statistics.median(rates["lockstep"]), statistics.median(rates["async"])
    ratio = async_ / lockstep
    print(f"\nlock-step {lockstep:.0f} rounds/h, async {async_:.0f} rounds/h (medians)")
    if made["lockstep"] and made["async"]:
        generation = statistics.median(made["async"]) / statistics.median(made["lockstep"])
        print(
            f"generation alone (rounds of B x L sampled per hour): async / lock-step = {generation:.2f}; "
            "an async round can feed more than one batch (every local group with signal is used, "
            "I at a time, where lock-step keeps I of a round and drops the rest)"
        )
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print(f"{verdict}: async {ratio:.2f} x lock-step's rounds/h (target >= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
