"""`sapo-sampler`: one node's sampler (settings: `SAPO_SAMPLER_*`, see `sapo.sampler.settings`)."""

from __future__ import annotations

from sapo.node.sampler import REFUSALS, SamplerService
from sapo.runtime import configure, serve
from sapo.sampler.settings import SamplerSettings


def main() -> int:
    settings = configure("sampler", SamplerSettings)
    return serve("sampler", settings, SamplerService.prepare, REFUSALS)


if __name__ == "__main__":
    raise SystemExit(main())
