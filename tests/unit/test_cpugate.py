"""The host-wide compute gate (`sapo.cpugate`): slots held across real processes, freed when a holder
dies, waits reported; the runtime's setting and the launcher's values."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sapo.cpugate import ComputeGate, NoGate, omp_threads, slots_for
from sapo.runtime import open_gate
from sapo.settings import ConfigError
from sapo.trainer.settings import TrainerSettings

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys
from pathlib import Path
from sapo.cpugate import ComputeGate
gate = ComputeGate.open(Path(sys.argv[1]), int(sys.argv[2]))
with gate.hold():
    print("held", flush=True)
    sys.stdin.readline()
"""


class Holder:
    """Another process holding a slot until told to let go (or killed)."""

    def __init__(self, directory: Path, slots: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory), str(slots)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.proc.kill()
        holder.proc.wait()


def free_slots(directory: Path) -> int:
    """Slots nobody holds now, tried without waiting."""
    free = 0
    for path in sorted(directory.glob("slot-*")):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free += 1
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return free


def enter_in_thread(gate: ComputeGate) -> tuple[threading.Thread, threading.Event]:
    """Enter the gate on a thread; the event is set once inside."""
    inside = threading.Event()

    def work() -> None:
        with gate.hold():
            inside.set()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, inside


def test_slots_follow_cpus_and_threads() -> None:
    assert slots_for(1, 1) == 1
    assert slots_for(16, 1) == 16
    assert slots_for(16, 4) == 4
    assert slots_for(2, 8) == 1  # one call at a time, never none
    assert omp_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert omp_threads({"OMP_NUM_THREADS": "0"}) == omp_threads({}) >= 1  # torch's default: every CPU


def test_one_slot_lets_one_process_in_at_a_time(tmp_path: Path, holders: list[Holder]) -> None:
    gate = ComputeGate.open(tmp_path, 1)
    holders.append(Holder(tmp_path, 1))
    assert free_slots(tmp_path) == 0
    thread, inside = enter_in_thread(gate)
    assert not inside.wait(0.5)  # waits while the other process holds the only slot
    holders[0].release()
    assert inside.wait(30)
    thread.join(30)
    assert free_slots(tmp_path) == 1


def test_two_slots_let_two_processes_in_and_the_third_waits(tmp_path: Path, holders: list[Holder]) -> None:
    holders += [Holder(tmp_path, 2), Holder(tmp_path, 2)]
    assert free_slots(tmp_path) == 0
    thread, inside = enter_in_thread(ComputeGate.open(tmp_path, 2))
    assert not inside.wait(0.5)
    holders[1].release()  # whichever slot frees, the waiter gets in
    holders[0].release()
    assert inside.wait(30)
    thread.join(30)


def test_a_killed_holder_frees_its_slot(tmp_path: Path, holders: list[Holder]) -> None:
    holders.append(Holder(tmp_path, 1))
    thread, inside = enter_in_thread(ComputeGate.open(tmp_path, 1))
    holders[0].proc.send_signal(signal.SIGKILL)
    holders[0].proc.wait(30)
    assert inside.wait(30)
    thread.join(30)


def test_the_runtime_reports_waits_in_prometheus_text(tmp_path: Path) -> None:
    settings = TrainerSettings(
        node_id="n", model="tiny:0", compute_gate_dir=tmp_path / "gate", compute_gate_slots=3
    )
    registry = CollectorRegistry()
    gate = open_gate("trainer", settings, registry)
    assert isinstance(gate, ComputeGate) and gate.slots == 3
    for _ in range(2):
        with gate.hold():
            pass
    text = generate_latest(registry).decode()
    assert "sapo_trainer_compute_gate_wait_seconds_count 2.0" in text
    assert sorted(p.name for p in (tmp_path / "gate").iterdir()) == ["slot-0", "slot-1", "slot-2"]
    gate.close()


def test_no_directory_means_no_gate_and_no_series() -> None:
    registry = CollectorRegistry()
    gate = open_gate("trainer", TrainerSettings(node_id="n", model="tiny:0"), registry)
    assert isinstance(gate, NoGate)
    assert "compute_gate" not in generate_latest(registry).decode()


def test_an_unusable_directory_fails_at_start_naming_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings = TrainerSettings(node_id="n", model="tiny:0", compute_gate_dir=blocker / "gate")
    with pytest.raises(ConfigError, match=r"SAPO_TRAINER_COMPUTE_GATE_DIR=.*set a writable directory"):
        open_gate("trainer", settings, CollectorRegistry())
