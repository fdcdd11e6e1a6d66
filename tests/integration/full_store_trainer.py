"""The trainer service with a checkpoint store that is full while a marker file exists
(`python -m tests.integration.full_store_trainer VERSION MARKER`): writing policy version VERSION
fails with ENOSPC, as a full volume's write does, until the marker is removed (space is back)."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from sapo.checkpoints import Published
from sapo.node.trainer import REFUSALS, TrainerService
from sapo.runtime import configure, serve
from sapo.trainer.settings import TrainerSettings

FULL_AT = int(sys.argv[1]) if __name__ == "__main__" else -1
MARKER = Path(sys.argv[2]) if __name__ == "__main__" else Path()


class FullStoreTrainer(TrainerService):
    def start(self) -> None:
        super().start()
        publish = self.trainer.store.publish

        def full(node_id: str, version: int, state: Mapping[str, torch.Tensor], **kwargs: Any) -> Published:
            if version == FULL_AT and MARKER.exists():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return publish(node_id, version, state, **kwargs)

        self.trainer.store.publish = full  # type: ignore[method-assign]


if __name__ == "__main__":
    raise SystemExit(
        serve("trainer", configure("trainer", TrainerSettings, argv=[]), FullStoreTrainer.prepare, REFUSALS)
    )
