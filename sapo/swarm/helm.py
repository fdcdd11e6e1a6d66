"""A swarm manifest as values of the `deploy/k8s/sapo-node` Helm chart: one values file per node.

The same mapping from the manifest's short keys to each service's settings as the local launcher
(`sapo.swarm.manifest.service_values`), so a swarm tried on one machine deploys to a cluster with the
same settings. What the chart owns is left to it: the node id, the topic prefix and the checkpoint
root (its volume), the HTTP port and the Kafka connection (set those in a values file of your own,
given to `helm install` before these, e.g. `-f kafka.yaml -f node-1.yaml`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sapo.swarm.launcher import flatten_env
from sapo.swarm.manifest import (
    NodeSpec,
    Service,
    SwarmManifest,
    resolve,
    service_values,
    sharing_peers,
    swarm_profiles,
)

CHART_OWNED = frozenset({"MODEL", "CHECKPOINT_ROOT"})
"""Settings the chart sets itself (model: once for generator and trainer; checkpoint root: its volume)."""


def _settings(node: NodeSpec, service: Service, peers: int, profiles: tuple[str, ...]) -> dict[str, str]:
    prefix = f"SAPO_{service.upper()}_"
    env = flatten_env(service, service_values(node, service, peers, profiles))
    return {
        name.removeprefix(prefix): value
        for name, value in sorted(env.items())
        if name.removeprefix(prefix) not in CHART_OWNED
    }


def node_values(manifest: SwarmManifest, node: NodeSpec) -> dict[str, Any]:
    """Chart values of one node of the manifest."""
    peers, profiles = sharing_peers(manifest, node), swarm_profiles(manifest)
    generator = _settings(node, "generator", peers, profiles)
    model = resolve(manifest, node, Path("checkpoints")).generator.model
    values: dict[str, Any] = {
        "nodeId": node.id,
        "model": model,
        "topicPrefix": manifest.topic_prefix,
        "generator": {"settings": generator},
        "sampler": {"settings": _settings(node, "sampler", peers, profiles)},
        "trainer": {"settings": _settings(node, "trainer", peers, profiles)},
    }
    # <service>.gpu switches image, GPU limit and BACKEND/DEVICE together: the CPU image has no CUDA.
    if generator.pop("BACKEND", None) == "vllm":
        values["generator"]["gpu"] = {"enabled": True}
    if values["trainer"]["settings"].pop("DEVICE", "cpu").startswith("cuda"):
        values["trainer"]["gpu"] = {"enabled": True}
    if "/" in model and not model.startswith("/") and ":" not in model:
        # A Hugging Face id: downloaded into the pods' cache before the services start (offline).
        values["models"] = {"download": {"enabled": True}}
    return values
