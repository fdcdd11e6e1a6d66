"""A host-wide limit on how many services compute with a model at once (`compute_gate_dir`).

Where the services of several nodes share a few CPUs (`sapo swarm` runs every node's services on one
machine), the kernel runs their model calls side by side: four trainers whose steps fall in the same
second take turns on a CPU every slice (`sapo.cpuslice`: 100 ms), and each turn starts on caches the
others filled. The same step then costs more CPU than it does alone. A step costs what it costs alone
when the steps run one after another, and the round ends no later for it: the CPU does the same work,
only in fewer pieces.

Measured with four processes each training the tiny model's `bench_pipeline` step, all on one CPU,
CPU seconds per step (medians of 24 steps, two runs each): one after another in one process 0.609 and
0.683; in four processes at the same time 0.668 and 0.734; in four processes taking turns through one
slot of this gate 0.615 and 0.587. In `bench_pipeline --side-by-side` (4 nodes, every service on one
CPU), the services' training step cost 1.31 and 1.13 x the in-process one without the gate and 1.11
and 1.05 x with it, and the services' round took 6.55 and 6.65 s against 6.04 and 6.01 s.

How: the directory holds `slots` lock files and a model call holds an exclusive `flock` on one of
them. The kernel drops the lock when its holder closes the file or dies, SIGKILL included, so a
crashed service never keeps a slot. Only the calls that keep a CPU busy for their whole length pass
through it: a generator's generation call and a trainer's step. Checkpoint writes and weight loads
mostly wait on storage and stay outside.

Services on Kubernetes leave it unset: each pod has CPUs of its own, and pods share no directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

POLL_S = 0.005
"""How often a caller waiting on a gate of several slots tries them again (a few syscalls each)."""


def slots_for(cpus: int, threads_per_call: int) -> int:
    """Slots for `cpus` CPUs when each model call runs `threads_per_call` threads: at least one."""
    return max(1, cpus // max(1, threads_per_call))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def omp_threads(env: Mapping[str, str]) -> int:
    """Threads a torch process started with `env` computes on: OMP_NUM_THREADS, else all CPUs."""
    value = env.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else usable_cpus()


class ComputeGate:
    """At most `slots` holders at once across every process that opens the same directory."""

    def __init__(self, files: list[int], observe: Callable[[float], None] | None = None) -> None:
        self._files = files
        self._observe = observe
        # flock belongs to an open file, which this process's threads share: a lock in the process
        # keeps a second thread from entering on the first one's slot.
        self._local = threading.Lock()

    @classmethod
    def open(cls, directory: Path, slots: int, observe: Callable[[float], None] | None = None) -> ComputeGate:
        """Open (and create) the slot files `directory/slot-<i>`; OSError if the directory cannot be used."""
        if slots < 1:
            raise ValueError(f"a compute gate has at least one slot, not {slots}")
        directory.mkdir(parents=True, exist_ok=True)
        files = [
            os.open(directory / f"slot-{i}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            for i in range(slots)
        ]
        return cls(files, observe)

    @property
    def slots(self) -> int:
        return len(self._files)

    def close(self) -> None:
        for fd in self._files:
            os.close(fd)
        self._files = []

    def _try(self, order: list[int]) -> int | None:
        for fd in order:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                continue
        return None

    def _take(self) -> int:
        """Take a free slot, waiting for one if all are taken; the slot's file. One slot is waited on in
        the kernel; several are polled every `POLL_S`, since a process can wait on only one flock at a
        time and waiting on one slot would leave a CPU idle while another slot is free."""
        start = os.getpid() % len(self._files)
        order = self._files[start:] + self._files[:start]
        if len(order) == 1:
            fcntl.flock(order[0], fcntl.LOCK_EX)
            return order[0]
        while (fd := self._try(order)) is None:
            time.sleep(POLL_S)
        return fd

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Run the block in a slot, waiting for one if all are taken (the wait goes to `observe`)."""
        started = time.monotonic()
        with self._local:
            fd = self._take()
            if self._observe is not None:
                self._observe(time.monotonic() - started)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


class NoGate:
    """No limit: the block runs at once."""

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


Gate = ComputeGate | NoGate
"""What services take: a real gate, or none."""
