"""`sapo-trainer`: one node's trainer (settings: `SAPO_TRAINER_*`, see `sapo.trainer.settings`)."""

from __future__ import annotations

from sapo.node.trainer import TrainerService
from sapo.runtime import serve
from sapo.trainer.settings import TrainerSettings


def main() -> int:
    return serve("trainer", TrainerSettings, TrainerService.from_runtime, preflight=TrainerService.preflight)


if __name__ == "__main__":
    raise SystemExit(main())
