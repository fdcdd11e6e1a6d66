"""`sapo-generator`: one node's generator process (settings from `SAPO_GENERATOR_*`, see settings.py)."""

from __future__ import annotations

from sapo.runtime import start_runtime
from sapo.settings import load_settings
from services.generator.core import build_generator
from services.generator.settings import GeneratorSettings


def main() -> int:
    """Run until SIGTERM/SIGINT or the configured round limit; exit status 0 on a clean stop."""
    settings = load_settings(GeneratorSettings)
    runtime = start_runtime("generator", settings)
    try:
        build_generator(settings, runtime).run()
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
