"""Every bench under bench/ still runs and still gives its verdict, at the smallest size it takes.

The benches are run by hand (`make bench`) and nothing else imports them, so a setting that moves
(bench_rounds' async runs once refused a `generator.max_ahead` the generator no longer had) breaks
them silently. Here each one runs as a user runs it, in its own process with one torch thread, and
must exit 0 and print its PASS/FAIL line. Which verdict it prints is a measurement of this machine,
never asserted. The benches on the bundled 135M model and the minutes-long ones are `slow`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
VERDICT = re.compile(r"^(PASS|FAIL)\b|\b(PASS|FAIL)$", re.MULTILINE)

QUICK: dict[str, str] = {
    "bench_draw": "--rows 4 --vocab 4096 --repeats 2",
    "bench_identity": "--nodes 4 --groups-per-node 2 --rounds 1",
    "bench_trainer": "--model tiny:0 --groups 2 --completions 2 --tokens 8 --repeats 1",
    "bench_sampler": "--nodes 20 --groups-per-node 5 --rounds 1 --batch-every 50",
    "bench_swarm_load": "--nodes 10 --rounds 2 --baseline-rounds 1 --round-s 1 --grace-s 5 --max-seconds 120",
    "bench_pipeline": "--model tiny:0 --nodes 2 --rounds 2",
    "bench_rounds": "--model tiny:0 --nodes 2 --rounds 2 --max-seconds 60",
}
SLOW: dict[str, str] = {
    "bench_idle": "--rounds 1 --settle-s 1 --window-s 2",
    "bench_replicas": "--model tiny:0 --rounds 2 --completions 2 --max-seconds 120",
    "bench_reload": "--repeats 1 --stores file --replicas 1",
    "bench_generator": "--rounds 1 --max-new-tokens 4 --samples 2 --dtype fp32",
    "bench_cpu_generation": "--rounds 1 --questions 1 --samples 2 --max-new-tokens 4",
}


def run_bench(name: str, args: str, tmp_path: Path) -> str:
    env = os.environ | {"OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / f"{name}.py"), *args.split()],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, (
        f"{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_every_bench_is_covered_here() -> None:
    benches = {p.stem for p in (REPO_ROOT / "bench").glob("bench_*.py")}
    assert benches == set(QUICK) | set(SLOW)


@pytest.mark.parametrize("name", sorted(QUICK))
def test_bench_runs_and_gives_its_verdict(name: str, tmp_path: Path) -> None:
    assert VERDICT.search(run_bench(name, QUICK[name], tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(900)  # bench_idle's two swarms: ~3 minutes on an idle 2-core machine
@pytest.mark.parametrize("name", sorted(SLOW))
def test_slow_bench_runs_and_gives_its_verdict(name: str, tmp_path: Path) -> None:
    assert VERDICT.search(run_bench(name, SLOW[name], tmp_path))
