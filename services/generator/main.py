"""`sapo-generator`: one node's generator (settings: `SAPO_GENERATOR_*`, see `sapo.generator.settings`)."""

from __future__ import annotations

from sapo.generator.settings import GeneratorSettings
from sapo.node.generator import GeneratorService
from sapo.runtime import serve


def main() -> int:
    service = GeneratorService
    return serve("generator", GeneratorSettings, service.from_runtime, preflight=service.preflight)


if __name__ == "__main__":
    raise SystemExit(main())
