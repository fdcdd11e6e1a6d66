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
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_TIMEOUT_S = 720
VERDICT = re.compile(r"^(PASS|FAIL)\b|\b(PASS|FAIL)$", re.MULTILINE)

QUICK: dict[str, str] = {
    "bench_draw": "--rows 4 --vocab 4096 --repeats 2",
    "bench_identity": "--nodes 4 --groups-per-node 2 --rounds 1",
    "bench_trainer": "--model tiny:0 --groups 2 --completions 2 --tokens 8 --repeats 1",
    "bench_sampler": "--nodes 20 --groups-per-node 5 --rounds 1 --batch-every 50",
    "bench_swarm_load": "--nodes 10 --rounds 2 --baseline-rounds 1 --round-s 1 --grace-s 5 --max-seconds 120",
    "bench_pipeline": "--model tiny:0 --nodes 2 --rounds 2",
    "bench_rounds": "--model tiny:0 --nodes 2 --rounds 2 --max-seconds 240",
}
SLOW: dict[str, str] = {
    "bench_idle": "--rounds 1 --settle-s 1 --window-s 2",
    "bench_replicas": "--model tiny:0 --rounds 2 --completions 2 --repeats 1 --max-seconds 240",
    "bench_reload": "--repeats 1 --replicas 1",
    "bench_generator": "--rounds 1 --max-new-tokens 4 --samples 2 --dtype fp32",
    "bench_cpu_generation": "--rounds 1 --questions 1 --samples 2 --max-new-tokens 4",
}


def run_bench(name: str, args: str, tmp_path: Path) -> str:
    """The bench's output once it exited 0. Its own --max-seconds caps are hang guards, far above what
    the run takes; past `BENCH_TIMEOUT_S` it gets SIGINT, as Ctrl-C, so that it stops the broker and
    services it started (the launcher starts them in sessions of their own) before the test fails."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    command = [sys.executable, str(REPO_ROOT / "bench" / f"{name}.py"), *args.split()]
    with subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=BENCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            pytest.fail(f"{name} ran past {BENCH_TIMEOUT_S} s:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    return out


def test_every_bench_is_covered_here() -> None:
    benches = {p.stem for p in (REPO_ROOT / "bench").glob("bench_*.py")}
    assert benches == set(QUICK) | set(SLOW)


@pytest.mark.timeout(BENCH_TIMEOUT_S + 120)
@pytest.mark.parametrize("name", sorted(QUICK))
def test_bench_runs_and_gives_its_verdict(name: str, tmp_path: Path) -> None:
    assert VERDICT.search(run_bench(name, QUICK[name], tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TIMEOUT_S + 120)
@pytest.mark.parametrize("name", sorted(SLOW))
def test_slow_bench_runs_and_gives_its_verdict(name: str, tmp_path: Path) -> None:
    if name == "bench_replicas" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("bench_replicas pins two generator replicas to a core each: this process has one core")
    assert VERDICT.search(run_bench(name, SLOW[name], tmp_path))
