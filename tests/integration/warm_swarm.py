"""The manifest of a small swarm of warm models, for integration tests that need groups with signal.

Untrained tiny models score 0 everywhere, so their groups have no signal and nothing reaches a
pool; a warm model (`sapo.models.warm`) starts where GRPO has signal. It is built into sapo's cache
before the swarm starts (~35 s on a 2-core machine the first time), so no service pays for it.
"""

from __future__ import annotations

from typing import Any

from sapo.models import warm_model_dir
from sapo.swarm.manifest import SwarmManifest, parse_manifest

WARM_MODEL = "warm:1:64x2:100"


def warm_swarm(
    name: str, bootstrap: str, topic_prefix: str, rounds: int, nodes: list[dict[str, Any]], **defaults: Any
) -> SwarmManifest:
    """Every node on WARM_MODEL, 4 questions x 4 completions of <= 16 tokens a round, lr 1e-3;
    `defaults` add to or override those (the mix, the round mode, services' raw settings)."""
    warm_model_dir(WARM_MODEL)
    base = {
        "model": WARM_MODEL,
        "questions_per_round": 4,
        "completions_per_question": 4,
        "rounds": rounds,
        "max_new_tokens": 16,
        "learning_rate": 1e-3,
    }
    return parse_manifest(
        {
            "name": name,
            "bootstrap": bootstrap,
            "topic_prefix": topic_prefix,
            "defaults": base | defaults,
            "nodes": nodes,
        }
    )
