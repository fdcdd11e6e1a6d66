"""Print the CPU image's lock input: pyproject's runtime dependencies less what the services never
import, with torch pinned to the CPU build.

`scripts/image.sh lock` feeds this to `uv pip compile --generate-hashes`; the result,
deploy/docker/requirements-cpu.lock, is what the image installs (`pip install --require-hashes`).
The dependency list stays declared once, in pyproject.toml.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Declared in pyproject but never imported by the generator, sampler or trainer:
#   matplotlib - the experiment report's plots (`sapo experiment` on a workstation);
#   trl        - not imported at all (it drags datasets, pyarrow and pandas: ~300 MB).
NOT_IN_IMAGE = frozenset({"matplotlib", "trl"})


def requirement_name(spec: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)
    if match is None:
        raise ValueError(f"not a requirement: {spec!r}")
    return match.group(0).lower().replace("_", "-")


def torch_pin(constraints: str) -> str:
    """`torch==X` from constraints/cpu.txt, as the local CPU build `torch==X+cpu` (the PyPI wheel of
    the same version is the CUDA build, gigabytes the image never uses)."""
    for line in constraints.splitlines():
        spec = line.split("#")[0].strip()
        if spec and requirement_name(spec) == "torch" and "==" in spec:
            return spec.split(";")[0].strip() + "+cpu"
    raise ValueError("constraints/cpu.txt pins no torch==X")


def image_requirements(pyproject: str, constraints: str) -> list[str]:
    dependencies: list[str] = tomllib.loads(pyproject)["project"]["dependencies"]
    kept = [d for d in dependencies if requirement_name(d) not in NOT_IN_IMAGE | {"torch"}]
    return [torch_pin(constraints), *kept]


def main() -> int:
    pyproject = (ROOT / "pyproject.toml").read_text()
    constraints = (ROOT / "constraints/cpu.txt").read_text()
    print("\n".join(image_requirements(pyproject, constraints)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
