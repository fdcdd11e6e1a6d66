"""The C allocator's setting for processes that run models: glibc's `glibc.malloc.hugetlb=1`.

torch takes its CPU tensors from malloc. Each generation step and each training step allocates and
frees tensors of megabytes (logits over a 49k-token vocabulary, activations), which glibc serves from
memory it maps afresh or trimmed from its heap, so every step faults the pages in again, 4 KiB at a
time. With the tunable, malloc asks the kernel for transparent huge pages (`madvise`), faulted in
2 MiB at a time. Measured with bench_pipeline.py's services swarm (4 nodes of `warm:0`, every process
on one CPU, 8 rounds; runs with and without it interleaved, two each): minor page faults per
generation call ~90,000 -> ~680 and per training step ~25,000 -> ~750; CPU per generation call
900-909 -> 764-809 ms and per training step 823-851 -> 776-779 ms; 7.71-7.91 -> 7.07-7.28 s per
round. The same work in one process faults less (~30,000 and ~14,000 per call); one run each
without and with it: 4.75 -> 4.35 s per round.

The dynamic loader reads the tunable when a process starts, so it goes into the environment of the
processes the project starts (the launcher's services, the container images); a running process
cannot turn it on. It does nothing where transparent huge pages are off (`never` in
/sys/kernel/mm/transparent_hugepage/enabled) or the C library is not glibc 2.35 or later.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

MALLOC_TUNABLE = "glibc.malloc.hugetlb=1"
_NAME = MALLOC_TUNABLE.partition("=")[0]


def with_malloc_tunable(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `MALLOC_TUNABLE` added to GLIBC_TUNABLES; an operator's own value of it is kept."""
    current = env.get("GLIBC_TUNABLES", "")
    if any(item.partition("=")[0] == _NAME for item in current.split(":")):
        return dict(env)
    return dict(env) | {"GLIBC_TUNABLES": ":".join(filter(None, (current, MALLOC_TUNABLE)))}


def restart_with_malloc_tunable() -> None:
    """Start this program again with the tunable when its environment lacks it: a benchmark's
    in-process baseline must allocate as the services it is compared with do."""
    env = with_malloc_tunable(os.environ)
    if env != dict(os.environ):
        sys.stdout.flush()
        os.execve(sys.executable, sys.orig_argv, env)
