"""What the kernel reports about scheduling slices (`sapo.cpuslice`), for tests."""

from __future__ import annotations

import platform
import re
from pathlib import Path

_SLICE = re.compile(r"^se\.slice\s*:\s*(\d+)", re.M)


def kernel_has_custom_slices() -> bool:
    """Linux 6.12 added custom slices for normal tasks (`sched_attr.sched_runtime`)."""
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return found is not None and (int(found[1]), int(found[2])) >= (6, 12)


def slice_ns(sched: Path = Path("/proc/thread-self/sched")) -> int | None:
    """A thread's slice as its `sched` file reports it (the calling thread's by default; None where the
    file has no slice line)."""
    found = _SLICE.search(sched.read_text())
    return int(found[1]) if found else None


def process_slices_ns(pid: int) -> dict[int, int | None]:
    """Every live thread of process `pid`: its slice. A thread that exits between the listing and the
    read (librdkafka and the ops server start and end short-lived threads) is left out."""
    slices: dict[int, int | None] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            slices[int(task.name)] = slice_ns(task / "sched")
        except FileNotFoundError:
            continue
    return slices
