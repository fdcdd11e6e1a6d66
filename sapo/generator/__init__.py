"""Pure helpers of the generator service: round pacing, group building and sharing policies.

No Kafka here: `sapo.node.generator` wires these to the transport, the model backend and the metrics.
- `pacing`: which policy version a round may be generated with (lockstep / async with bounded staleness).
- `groups`: a round's questions and prompts, RolloutGroups built from sampled completions, and
  `generate_round`, which does the whole round with a backend.
- `sharing`: which groups go to the swarm topic.
- `reload`: retrying a policy version that failed to load, and when to give up.
- `settings`: `GeneratorSettings`, the service's settings (imported from there, not from this package).
"""

from sapo.generator.groups import (
    BatchContext,
    GeneratedRound,
    RoundPrompt,
    RoundSource,
    build_group,
    generate_round,
    plan_round,
    round_seed,
    to_completion,
)
from sapo.generator.pacing import Pacing, PacingMode
from sapo.generator.reload import ReloadPolicy, Retry, is_transient
from sapo.generator.sharing import SharingPolicy, should_share

__all__ = [
    "BatchContext",
    "GeneratedRound",
    "Pacing",
    "PacingMode",
    "ReloadPolicy",
    "Retry",
    "RoundPrompt",
    "RoundSource",
    "SharingPolicy",
    "build_group",
    "generate_round",
    "is_transient",
    "plan_round",
    "round_seed",
    "should_share",
    "to_completion",
]
