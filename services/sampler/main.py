"""`sapo-sampler`: settings -> runtime -> recovery -> consume and emit until SIGTERM -> close in reverse."""

from __future__ import annotations

import sys

from sapo.runtime import start_runtime
from sapo.settings import load_settings
from services.sampler.core import SERVICE, build_core
from services.sampler.settings import SamplerSettings


def main() -> int:
    settings = load_settings(SamplerSettings)
    runtime = start_runtime(SERVICE, settings)
    try:
        core = build_core(runtime, settings)
        if core is None:  # stopped while recovering: nothing was consumed
            return 0
        try:
            core.run()
        finally:
            core.close()
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
