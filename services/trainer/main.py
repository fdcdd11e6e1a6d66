"""`sapo-trainer`: one node's trainer (settings: `SAPO_TRAINER_*`, see `sapo.trainer.settings`)."""

from __future__ import annotations

from sapo.runtime import configure, serve
from sapo.trainer.settings import TrainerSettings


def main() -> int:
    settings = configure("trainer", TrainerSettings)
    # After the settings: the service loads torch and transformers (seconds), bad settings fail before.
    from sapo.node.trainer import REFUSALS, TrainerService

    return serve("trainer", settings, TrainerService.prepare, REFUSALS)


if __name__ == "__main__":
    raise SystemExit(main())
