"""Where the shipped scenarios are: importable without the experiment's (torch-heavy) modules, so that
`sapo --help` lists them without loading a model stack."""

from __future__ import annotations

from pathlib import Path

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def scenario_names() -> list[str]:
    """The shipped scenarios (file stems under SCENARIO_DIR)."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
