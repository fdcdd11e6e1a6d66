"""The generator's settings fingerprint: a short digest of exactly the settings that decide what a
replica publishes for a work item, written on each of its groups (`sapo.wire.H_GENERATOR_CONFIG`).

A node's generator replicas share its work topic as one consumer group, and an item whose replica
died is sampled again by another under the same group id (`sapo.generator.work`). Replicas whose
settings differ then publish different content under one id, and nothing refuses it: a rolling update
runs old and new settings side by side on purpose. The node's sampler counts the fingerprints its own
groups carry (`sapo.sampler.configs`), so that a difference that outlasts a rollout is seen.

In the digest (content): the model and how it samples (backend, dtype, quantization, and the kind
of device: cpu and cuda draw other numbers from one seed), the task profile as resolved (each task's
weight and full dataset configuration, so a file and the built-in profile it copies agree), the
effective node seed, L, temperature, top-p, max new tokens, and sharing (which groups go to the
swarm). Everything else is operational and left out: transport, ports, logging, identity, batching,
timeouts, retries, and the node id itself (the same for every replica of a node; it enters through
the seed it derives). `tests/unit/generator/test_fingerprint.py` classifies every setting, so a new
one must be put on one side.
"""

from __future__ import annotations

from typing import Any

from sapo.generator.settings import GeneratorSettings
from sapo.tasks.profiles import provenance_config
from sapo.tasks.records import canonical_json, sha256_hex
from sapo.wire import GENERATOR_CONFIG_CHARS

_DOMAIN = "sapo-generator-config/v1\x00"
"""Prefixed to what is digested: a later definition of the fingerprint gives other values."""


def content_settings(settings: GeneratorSettings) -> dict[str, Any]:
    """The settings that decide a group's content and where it goes, as plain JSON values."""
    return {
        "model": settings.model,
        "backend": settings.backend.value,
        "dtype": settings.dtype.value,
        "quantization": settings.quantization.value,
        "device": settings.device.partition(":")[0],  # cuda:0 and cuda:1 sample alike
        "profile": [[spec.name, spec.weight, provenance_config(spec)] for spec in settings.task_profile()],
        "node_seed": settings.effective_node_seed,
        "completions_per_question": settings.completions_per_question,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_new_tokens": settings.max_new_tokens,
        "sharing": settings.sharing.value,
        "share_fraction": settings.share_fraction,
    }


def settings_fingerprint(settings: GeneratorSettings) -> str:
    """`GENERATOR_CONFIG_CHARS` lower-case hex digits of the SHA-256 of `content_settings` in canonical
    JSON: the same in every process and on every machine for the same settings."""
    return sha256_hex(_DOMAIN + canonical_json(content_settings(settings)))[:GENERATOR_CONFIG_CHARS]
