"""Pure helpers of the generator service: work items and pacing, group building, sharing policies.

No Kafka here: `sapo.node.generator` wires these to the transport, the model backend and the metrics.
- `work`: work items (one question of one round), what they determine (question, seeds, group id),
  pacing (which policy versions may generate a round) and which rounds may start.
- `groups`: RolloutGroups built from sampled completions, and `generate_items`, which samples the
  items a replica holds in one backend call.
- `sharing`: which groups go to the swarm topic.
- `reload`: retrying a policy version that failed to load, and when to give up.
- `settings`: `GeneratorSettings`, the service's settings (imported from there, not from this package).

The names below are imported on first use (`sapo.lazy`): `groups` loads torch, the settings must not.
"""

from typing import TYPE_CHECKING

from sapo.lazy import lazy_exports

if TYPE_CHECKING:
    from sapo.generator.groups import (
        BatchContext,
        Generated,
        RoundPrompt,
        RoundSource,
        build_group,
        generate_items,
        to_completion,
    )
    from sapo.generator.reload import ReloadPolicy, Retry, is_transient
    from sapo.generator.sharing import SharingPolicy, should_share
    from sapo.generator.work import Item, Pacing, PacingMode, group_id, item_seed, plan_rounds, round_items
else:
    __getattr__ = lazy_exports(
        __name__,
        {
            "sapo.generator.groups": (
                "BatchContext",
                "Generated",
                "RoundPrompt",
                "RoundSource",
                "build_group",
                "generate_items",
                "to_completion",
            ),
            "sapo.generator.reload": ("ReloadPolicy", "Retry", "is_transient"),
            "sapo.generator.sharing": ("SharingPolicy", "should_share"),
            "sapo.generator.work": (
                "Item",
                "Pacing",
                "PacingMode",
                "group_id",
                "item_seed",
                "plan_rounds",
                "round_items",
            ),
        },
    )

__all__ = [
    "BatchContext",
    "Generated",
    "Item",
    "Pacing",
    "PacingMode",
    "ReloadPolicy",
    "Retry",
    "RoundPrompt",
    "RoundSource",
    "SharingPolicy",
    "build_group",
    "generate_items",
    "group_id",
    "is_transient",
    "item_seed",
    "plan_rounds",
    "round_items",
    "should_share",
    "to_completion",
]
