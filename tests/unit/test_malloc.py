"""The allocator tunable the project's processes start with (`sapo.malloc`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sapo.malloc import MALLOC_TUNABLE, with_malloc_tunable

pytestmark = pytest.mark.unit


def test_the_tunable_is_added_beside_the_environment_and_the_operators_other_tunables() -> None:
    assert with_malloc_tunable({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": MALLOC_TUNABLE}
    env = with_malloc_tunable({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{MALLOC_TUNABLE}"}


@pytest.mark.parametrize("own", ["glibc.malloc.hugetlb=0", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"])
def test_an_operators_own_hugetlb_setting_is_kept(own: str) -> None:
    assert with_malloc_tunable({"GLIBC_TUNABLES": own}) == {"GLIBC_TUNABLES": own}


def _dynamic_loader() -> Path:
    """The dynamic loader this interpreter was started by (it lists the tunables it read)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/ld-linux" in path:
            return Path(path)
    pytest.skip("not a glibc Linux process: the tunable is a no-op there")


def test_this_glibc_reads_the_tunable_as_set() -> None:
    """A misspelt or out-of-range tunable is ignored silently at start: the loader must list it set."""
    command = [str(_dynamic_loader()), "--list-tunables"]
    listed = subprocess.run(command, env=with_malloc_tunable({}), capture_output=True, text=True, check=True)
    listed_text = listed.stdout
    name = MALLOC_TUNABLE.partition("=")[0]
    assert f"{name}: 0x1 " in listed_text, [line for line in listed_text.splitlines() if "malloc" in line]


def test_a_program_started_without_the_tunable_restarts_with_it_and_its_arguments(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(
        "import os, sys\n"
        "from sapo.malloc import restart_with_malloc_tunable\n"
        "print('start', flush=True)\n"
        "restart_with_malloc_tunable()\n"
        "print(os.environ['GLIBC_TUNABLES'], sys.argv[1:])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, str(script), "--x", "1"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == ["start", "start", f"{MALLOC_TUNABLE} ['--x', '1']"]
