"""Run a service's entrypoint in a process of its own, for tests of what it does at start."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_service(
    service: str, variables: Mapping[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m services.<service>.main` with `variables` set over this environment cleared of the
    service's own (`SAPO_<SERVICE>_*`), run until it exits."""
    prefix = f"SAPO_{service.upper()}_"
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefix)} | dict(variables)
    return subprocess.run(
        [sys.executable, "-m", f"services.{service}.main"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )
