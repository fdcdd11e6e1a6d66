"""Entry point of `sapo-trainer`: settings -> runtime -> resume or initial version -> train until SIGTERM."""

from __future__ import annotations

import sys

from sapo.runtime import start_runtime
from sapo.settings import load_settings
from services.trainer.core import SERVICE, TrainerService
from services.trainer.settings import TrainerSettings


def main() -> int:
    settings = load_settings(TrainerSettings)
    runtime = start_runtime(SERVICE, settings)
    try:
        service = TrainerService.from_runtime(settings, runtime)
        service.start()
        service.run()
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
