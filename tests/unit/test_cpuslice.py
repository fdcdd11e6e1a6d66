"""The CPU slice a service's threads ask the kernel for (`sapo.cpuslice`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from sapo.cpuslice import MAX_SLICE_MS, granted_ms, request_cpu_slice, slice_attr
from tests.sched import kernel_has_custom_slices, slice_ns

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling calls only"),
]

T = TypeVar("T")


def _in_thread(work: Callable[[], T]) -> T:
    """Run `work` on a fresh thread, so the test process's own threads keep their slices."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def test_the_attribute_keeps_policy_and_nice_and_carries_the_slice() -> None:
    attr = slice_attr(20.0, os.SCHED_BATCH, 5)
    assert len(attr) == 48  # SCHED_ATTR_SIZE_VER0
    assert int.from_bytes(attr[:4], "little") == 48
    assert int.from_bytes(attr[4:8], "little") == os.SCHED_BATCH
    assert int.from_bytes(attr[16:20], "little", signed=True) == 5
    assert granted_ms(attr) == 20.0


@pytest.mark.parametrize("slice_ms", [0.0, -1.0, MAX_SLICE_MS + 1])
def test_a_slice_outside_the_kernels_range_is_refused(slice_ms: float) -> None:
    with pytest.raises(ValueError, match="CPU slice"):
        slice_attr(slice_ms, os.SCHED_OTHER, 0)


def test_zero_asks_for_nothing() -> None:
    def work() -> tuple[int | None, float | None, int | None]:
        return slice_ns(), request_cpu_slice(0.0), slice_ns()

    before, granted, after = _in_thread(work)
    assert granted is None and before == after


def test_the_thread_and_the_threads_it_starts_get_the_slice() -> None:
    def work() -> tuple[float | None, int | None, int | None]:
        granted = request_cpu_slice(20.0)
        return granted, slice_ns(), _in_thread(slice_ns)

    granted, own, child = _in_thread(work)
    if not kernel_has_custom_slices():
        assert granted == 0.0  # accepted and ignored
        return
    assert granted == 20.0
    assert own == child == 20_000_000


def test_a_niced_thread_stays_niced() -> None:
    def work() -> tuple[float | None, int, int]:
        os.setpriority(os.PRIO_PROCESS, 0, 7)  # this thread only; raising nice needs no privilege
        return request_cpu_slice(30.0), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)

    granted, nice, policy = _in_thread(work)
    assert (nice, policy) == (7, os.SCHED_OTHER)
    assert granted == (30.0 if kernel_has_custom_slices() else 0.0)
