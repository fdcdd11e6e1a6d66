"""A longer CPU time slice for the project's processes (Linux 6.12+, `sched_setattr`).

Linux's fair scheduler (EEVDF, 6.6+) gives a runnable thread a base slice of 0.75 ms x (1 + log2 CPUs),
1.4 ms on a 2-core host, and lets a waking thread whose deadline comes earlier preempt the running one.
On a CPU that several of a swarm's processes share (a one-machine swarm, pods packed on a node), the
threads that wake all the time (the broker answering fetches, the Kafka clients' threads, the HTTP
servers) then preempt model steps mid-slice again and again: each time the step resumes with caches
the other evicted, and the waking work runs in many small pieces. Since 6.12 a thread may ask for its
own slice (`sched_attr.sched_runtime` of a normal task, 0.1-100 ms, no privilege needed). With a
longer slice a waking thread's deadline comes later, so it waits until the running thread blocks or
its slice ends, and several wake-ups are served in one go (what that costs: below).

Who asks: every service, before its HTTP server and Kafka clients start (`sapo.runtime.start_runtime`,
setting `cpu_slice_ms`), and `sapo swarm`'s launcher before it starts the embedded broker and the
services. A thread inherits the slice of the thread that starts it, a process that of the thread that
forks it.

Measured with bench_pipeline.py (4 nodes of `warm:0`, every process on one CPU, 6 rounds; CPU of the
calling thread per generation call and per training step, medians):

| | s per round | generation call | training step | broker CPU s |
|---|---|---|---|---|
| kernel default | 8.70 | 0.58 | 1.17 | 6.9 |
| only the services' model threads ask | 8.79 | 0.62 | 1.09 | 7.4 |
| every thread of the services asks, the broker keeps the default | 8.68 | 0.59 | 1.11 | 7.4 |
| the services and the launcher ask (the broker inherits) | 7.06 | 0.50 | 0.97 | 4.0 |
| the same calls in one process, no Kafka | 5.1-6.2 | 0.43-0.55 | 0.75-0.95 | - |

The broker's fetch handling was what preempted the model steps: its CPU fell by half once it ran in
longer stretches, and the services' calls cost what they cost in one process.

The length asked for is the kernel's longest, 100 ms. Run against 50 ms, alternating, two
`--side-by-side` runs each on the idle host: the services' round 6.76 and 6.42 s against 7.33 and 7.24,
their CPU 134.5-135.8 s a run against 144.6-151.9, the broker's 5.1-5.3 against 6.2-6.8 (20 ms, one run
in turn: 6.59 s a round against 7.06 at 50). The cost is latency on a saturated CPU only: a thread that
wakes there may wait for the running one's slice to end (up to 100 ms) instead of preempting it; where
a CPU has idle time, a waking thread runs at once whatever the slice.

Older kernels accept the call and ignore the slice; the setting is read back (`sched_getattr`) to say
which happened. Elsewhere (not Linux, an architecture without a known system call number) nothing is
requested.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct
import sys

log = logging.getLogger(__name__)

DEFAULT_SLICE_MS = 100.0
"""What the services and the one-machine launcher ask for unless told otherwise."""
MAX_SLICE_MS = 100.0
"""The kernel's upper bound on a requested slice (it clamps to 0.1-100 ms)."""

_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
"""(sched_setattr, sched_getattr) per machine."""
_ATTR = struct.Struct("IIQiIQQQ")  # sched_attr up to sched_period: SCHED_ATTR_SIZE_VER0 = 48 bytes
_FAIR = (os.SCHED_OTHER, os.SCHED_BATCH) if sys.platform == "linux" else ()
"""Policies a custom slice applies to (real-time ones have their own scheduling)."""


def slice_attr(slice_ms: float, policy: int, nice: int) -> bytes:
    """A `sched_attr` that keeps `policy` and `nice` and asks for `slice_ms` as the slice."""
    if not 0.0 < slice_ms <= MAX_SLICE_MS:
        raise ValueError(f"a CPU slice is above 0 and at most {MAX_SLICE_MS:.0f} ms, not {slice_ms}")
    return _ATTR.pack(_ATTR.size, policy, 0, nice, 0, round(slice_ms * 1e6), 0, 0)


def granted_ms(attr: bytes) -> float:
    """The slice a `sched_attr` read back from the kernel carries, in ms (0: the default slice)."""
    runtime_ns: int = _ATTR.unpack_from(attr)[5]
    return runtime_ns / 1e6


def request_cpu_slice(slice_ms: float) -> float | None:
    """Ask for a `slice_ms` slice for the calling thread and the threads it starts later; the slice the
    kernel reports afterwards in ms (0.0: it kept its default), or None where nothing was asked. Keeps
    the thread's policy and nice value; a kernel that refuses is logged, never raised."""
    numbers = _SYSCALLS.get(platform.machine()) if sys.platform == "linux" else None
    if numbers is None or slice_ms <= 0:
        return None
    setattr_nr, getattr_nr = numbers
    policy = os.sched_getscheduler(0)
    if policy not in _FAIR:
        log.info("CPU slice not requested: this thread runs under real-time policy %d", policy)
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    attr = ctypes.create_string_buffer(slice_attr(slice_ms, policy, nice), _ATTR.size)
    if libc.syscall(setattr_nr, 0, attr, 0) != 0:
        log.warning("CPU slice of %.1f ms refused: %s", slice_ms, os.strerror(ctypes.get_errno()))
        return None
    back = ctypes.create_string_buffer(_ATTR.size)
    if libc.syscall(getattr_nr, 0, back, _ATTR.size, 0) != 0:
        return None
    granted = granted_ms(back.raw)
    if granted:
        log.info("CPU slice %.1f ms for this thread and the threads it starts", granted)
    else:
        log.info(
            "CPU slice of %.1f ms requested; this kernel keeps its default (custom slices: 6.12+)", slice_ms
        )
    return granted
