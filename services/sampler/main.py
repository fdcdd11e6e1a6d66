"""`sapo-sampler`: one node's sampler (settings: `SAPO_SAMPLER_*`, see `sapo.sampler.settings`)."""

from __future__ import annotations

from sapo.node.sampler import SamplerService
from sapo.runtime import serve
from sapo.sampler.settings import SamplerSettings


def main() -> int:
    return serve("sampler", SamplerSettings, SamplerService.from_runtime)


if __name__ == "__main__":
    raise SystemExit(main())
