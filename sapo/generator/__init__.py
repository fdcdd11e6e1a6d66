"""Pure helpers of the generator service: work items and pacing, group building, sharing policies.

No Kafka here: `sapo.node.generator` wires these to the transport, the model backend and the metrics.
- `work`: work items (one question of one round), what they determine (question, seeds, group id),
  pacing (which policy versions may generate a round) and which rounds may start.
- `groups`: RolloutGroups built from sampled completions, and `generate_items`, which samples the
  items a replica holds in one backend call.
- `sharing`: which groups go to the swarm topic.
- `reload`: retrying a policy version that failed to load, and when to give up.
- `fingerprint`: the digest of the settings that decide a group's content, written on each group.
- `settings`: `GeneratorSettings`, the service's settings (imported from there, not from this package).

The names below are imported on first use (`sapo.lazy`): `groups` loads torch, the settings must not.
"""

from typing import TYPE_CHECKING

from sapo.lazy import lazy_exports

if TYPE_CHECKING:
    from sapo.generator.groups import BatchContext as BatchContext
    from sapo.generator.groups import Generated as Generated
    from sapo.generator.groups import RoundPrompt as RoundPrompt
    from sapo.generator.groups import RoundSource as RoundSource
    from sapo.generator.groups import build_group as build_group
    from sapo.generator.groups import generate_items as generate_items
    from sapo.generator.groups import to_completion as to_completion
    from sapo.generator.reload import ReloadPolicy as ReloadPolicy
    from sapo.generator.reload import Retry as Retry
    from sapo.generator.reload import is_transient as is_transient
    from sapo.generator.sharing import SharingPolicy as SharingPolicy
    from sapo.generator.sharing import should_share as should_share
    from sapo.generator.work import Item as Item
    from sapo.generator.work import Pacing as Pacing
    from sapo.generator.work import PacingMode as PacingMode
    from sapo.generator.work import group_id as group_id
    from sapo.generator.work import item_seed as item_seed
    from sapo.generator.work import plan_rounds as plan_rounds
    from sapo.generator.work import round_items as round_items
else:
    __getattr__, __dir__, __all__ = lazy_exports(__name__)
