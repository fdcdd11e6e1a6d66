"""A sampler that finishes (and so commits) every group the moment it pools it, before any batch holds
it: a crash then loses pooled groups. The conformance kit must fail it (contract section 5.3)."""

from __future__ import annotations

from sapo.kafka import Disposition, Record
from sapo.node.sampler import REFUSALS, SamplerService
from sapo.runtime import configure, serve
from sapo.sampler import Origin
from sapo.sampler.settings import SamplerSettings


class EarlyCommitSampler(SamplerService):
    def _handle(self, origin: Origin, record: Record) -> Disposition:
        super()._handle(origin, record)
        return Disposition.DONE


if __name__ == "__main__":
    raise SystemExit(
        serve("sampler", configure("sampler", SamplerSettings), EarlyCommitSampler.prepare, REFUSALS)
    )
