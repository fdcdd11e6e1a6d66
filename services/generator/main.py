"""`sapo-generator`: one node's generator (settings: `SAPO_GENERATOR_*`, see `sapo.generator.settings`)."""

from __future__ import annotations

from sapo.generator.settings import GeneratorSettings
from sapo.runtime import configure, serve


def main() -> int:
    settings = configure("generator", GeneratorSettings)
    # After the settings: the service loads torch and transformers (seconds), bad settings fail before.
    from sapo.node.generator import REFUSALS, GeneratorService

    return serve("generator", settings, GeneratorService.prepare, REFUSALS)


if __name__ == "__main__":
    raise SystemExit(main())
