"""Two broken generators the conformance kit must fail (`python -m tests.conformance.broken_generator MODE`):

- `versions`: samples every work item with whatever policy it holds, ignoring the versions the item
  allows (contract section 7.1): lock-step rounds then mix policies.
- `unsigned`: publishes its groups without signing them although it has a key (section 3.2).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from sapo.generator.settings import GeneratorSettings
from sapo.kafka import Disposition, Record
from sapo.node.generator import REFUSALS, GeneratorService
from sapo.runtime import Runtime, configure, serve


class VersionBlindGenerator(GeneratorService):
    def _hold(self, record: Record) -> Disposition:
        disposition = super()._hold(record)
        for held in self._held.all():
            blind = dataclasses.replace(held.item, min_version=0, max_version=None)
            self._held.remove((held.item.round, held.item.position))
            self._held.add(held._replace(item=blind))
        return disposition


def unsigned(settings: GeneratorSettings) -> Callable[[Runtime], GeneratorService]:
    build = GeneratorService.prepare(settings)

    def unsigned_service(runtime: Runtime) -> GeneratorService:
        service = build(runtime)
        service._signer = None  # the breakage under test
        return service

    return unsigned_service


if __name__ == "__main__":
    mode = sys.argv[1]
    prepare = VersionBlindGenerator.prepare if mode == "versions" else unsigned
    raise SystemExit(
        serve("generator", configure("generator", GeneratorSettings, argv=[]), prepare, REFUSALS)
    )
