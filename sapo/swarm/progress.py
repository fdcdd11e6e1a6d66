"""Live progress of a local swarm, read from each service's own /metrics endpoint."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import ClassVar

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str, names: Collection[str] | None = None, timeout_s: float = 2.0) -> Samples:
    """Metric samples by name (only `names`, when given: asked of the service with `name[]` and kept
    from its answer, so a service that ignores the parameter answers right too); empty when the
    service is not up yet."""
    if names is not None:
        url += "?" + urllib.parse.urlencode([("name[]", n) for n in sorted(names)])
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    if names is not None:
        text = only(text, names)
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return samples


def only(text: str, names: Collection[str]) -> str:
    """The sample lines of `names` in Prometheus text. The parser reads an exposition character by
    character; a local swarm's launcher parsing twelve services' whole expositions twice a second spent
    ~13% of a core on it (bench/profile_round.py), for seven numbers."""
    return "\n".join(
        line
        for line in text.splitlines()
        if line and line[0] != "#" and line.partition("{")[0].partition(" ")[0] in names
    )


def total(samples: Samples, name: str, **match: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if all(labels.get(k) == m for k, m in match.items()))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in samples.get(name, []):
        key = labels.get(label, "")
        out[key] = out.get(key, 0.0) + v
    return out


@dataclass(frozen=True)
class NodeStatus:
    """One node's progress, from its services' metrics (`METRICS` are all that `read` needs)."""

    node: str
    groups: int
    policy_version: int
    reward: float
    local_used: int
    external_used: int
    rejected: int
    steps: int

    METRICS: ClassVar[frozenset[str]] = frozenset(
        {
            "sapo_sampler_batch_groups_sum",
            "sapo_generator_reward_sum",
            "sapo_generator_reward_count",
            "sapo_generator_groups_total",
            "sapo_trainer_announced_version",
            "sapo_sampler_groups_rejected_total",
            "sapo_trainer_steps_total",
        }
    )

    @classmethod
    def read(cls, node: str, generator: Samples, sampler: Samples, trainer: Samples) -> NodeStatus:
        used = by_label(sampler, "sapo_sampler_batch_groups_sum", "source")
        reward_sum = total(generator, "sapo_generator_reward_sum")
        reward_count = total(generator, "sapo_generator_reward_count")
        return cls(
            node=node,
            groups=int(total(generator, "sapo_generator_groups_total")),
            policy_version=int(total(trainer, "sapo_trainer_announced_version")),
            reward=reward_sum / reward_count if reward_count else float("nan"),
            local_used=int(used.get("local", 0)),
            external_used=int(used.get("external", 0)),
            rejected=int(total(sampler, "sapo_sampler_groups_rejected_total")),
            steps=int(total(trainer, "sapo_trainer_steps_total")),
        )


def render(statuses: Iterable[NodeStatus], rounds: int, elapsed_s: float) -> str:
    header = (
        f"{'node':<12} {'version':>8} {'groups':>7} {'reward':>7} {'local':>6} {'extern':>6} {'reject':>6}"
    )
    lines = [f"sapo swarm — {elapsed_s:6.0f}s elapsed, target {rounds} rounds", header]
    for s in statuses:
        reward = f"{s.reward:.3f}" if s.reward == s.reward else "-"
        lines.append(
            f"{s.node:<12} {s.policy_version:>5}/{rounds:<2} {s.groups:>7} {reward:>7} "
            f"{s.local_used:>6} {s.external_used:>6} {s.rejected:>6}"
        )
    return "\n".join(lines)
