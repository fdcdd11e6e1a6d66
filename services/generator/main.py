"""`sapo-generator`: one node's generator (settings: `SAPO_GENERATOR_*`, see `sapo.generator.settings`)."""

from __future__ import annotations

from sapo.generator.settings import GeneratorSettings
from sapo.node.generator import GeneratorService
from sapo.runtime import serve


def main() -> int:
    return serve("generator", GeneratorSettings, GeneratorService.from_runtime)


if __name__ == "__main__":
    raise SystemExit(main())
