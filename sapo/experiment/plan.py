"""What an experiment runs: a profile (scale) x I/J configurations x seeds, each one swarm manifest.

The paper's comparison: every node trains on I local + J external groups per round, with
(I, J) in 8/0, 6/2, 4/4, 2/6, 8 questions x 8 completions, lock-step rounds, GRPO with KL 0. Everything
but (I, J) is the same across the configurations of one seed, so the configurations differ only in how
much each node learns from the others.

Profiles:
- `cpu`: 4 nodes of `warm:<seed>` (a 3.2M-parameter Llama with the bundled tokenizer, briefly
  supervised so that its pre-RL reward sits where GRPO has signal: see `sapo.models.warm`), easy tasks.
  Sized so the four configurations x 3 seeds finish in under an hour on 2 CPU cores.
- `paper`: 8 x Qwen2.5-0.5B-Instruct, the paper's nine tasks, 256 new tokens, 2000 rounds; for GPU
  machines (vLLM generation, bf16 training). The model must be reachable (a local path or a
  pre-populated Hugging Face cache): `--model` overrides it.

All nodes of one run start from the same weights, as in the paper; they differ in their question
streams and sampling seeds (per-node seeds), and J is sampled from the pool of the other nodes' groups.
Measured: with >= 4 nodes and J sampled, identical initial weights do not make the nodes train on the
same batches. The experiment seed changes the initial model (`warm:<seed>`), every node's streams
and the samplers' choices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from sapo.settings import ConfigError

PAPER_MIXES: tuple[tuple[int, int], ...] = ((8, 0), (6, 2), (4, 4), (2, 6))
_MIX = re.compile(r"^(\d+)/(\d+)$")


@dataclass(frozen=True)
class ExperimentProfile:
    """The scale of an experiment; every run of it uses these values."""

    name: str
    model: str
    """Model ref of every node; `{seed}` is replaced by the experiment seed."""
    nodes: int
    rounds: int
    task_profile: str
    questions_per_round: int = 8
    completions_per_question: int = 8
    max_new_tokens: int = 24
    learning_rate: float = 1e-3
    mixes: tuple[tuple[int, int], ...] = PAPER_MIXES
    seeds: tuple[int, ...] = (0, 1, 2)
    eval_questions: int = 64
    eval_samples: int = 4
    generator: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)


PROFILES: dict[str, ExperimentProfile] = {
    "cpu": ExperimentProfile(
        name="cpu",
        model="warm:{seed}",
        nodes=4,
        # ~13 s per 4-node round through the services on 2 shared cores: 12 runs x 20 rounds fit in
        # under an hour with start-up and evaluation.
        rounds=20,
        task_profile="easy",
        max_new_tokens=24,
        # The tiny model learns at the paper's stated 1e-3 (bench/calibrate_warm.py: 0.18 -> 0.30 in
        # 40 local-only rounds); 1e-5 does not move it.
        learning_rate=1e-3,
        trainer={"checkpoint_every": 1, "keep_last": 2},
        sampler={"lockstep_timeout_s": 120},
    ),
    "paper": ExperimentProfile(
        name="paper",
        model="Qwen/Qwen2.5-0.5B-Instruct",
        nodes=8,
        rounds=2000,
        task_profile="paper",
        max_new_tokens=256,
        # The paper says 1e-3, its reference code uses 1e-6..1e-5; 1e-6 is the code's value.
        learning_rate=1e-6,
        eval_questions=256,
        eval_samples=8,
        generator={"backend": "vllm", "dtype": "bfloat16", "device": "cuda"},
        trainer={"checkpoint_every": 1, "keep_last": 2, "precision": "bf16", "device": "cuda"},
        sampler={"lockstep_timeout_s": 600},
    ),
}


def parse_mix(text: str) -> tuple[int, int]:
    """'6/2' -> (6, 2)."""
    found = _MIX.match(text.strip())
    if found is None:
        raise ConfigError(f"configuration {text!r}: write it as I/J, e.g. 6/2")
    return int(found[1]), int(found[2])


def mix_name(mix: tuple[int, int]) -> str:
    return f"{mix[0]}/{mix[1]}"


def run_name(mix: tuple[int, int], seed: int) -> str:
    """Directory name of one run: `i6-j2-s0`."""
    return f"i{mix[0]}-j{mix[1]}-s{seed}"


def select(
    profile: ExperimentProfile,
    *,
    mixes: tuple[tuple[int, int], ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    rounds: int | None = None,
    nodes: int | None = None,
    model: str | None = None,
) -> ExperimentProfile:
    """The profile with command-line overrides applied and checked."""
    chosen = replace(
        profile,
        mixes=mixes or profile.mixes,
        seeds=seeds or profile.seeds,
        rounds=rounds or profile.rounds,
        nodes=nodes or profile.nodes,
        model=model or profile.model,
    )
    for local, external in chosen.mixes:
        if local > chosen.questions_per_round:
            raise ConfigError(
                f"configuration {local}/{external}: I cannot exceed the {chosen.questions_per_round} "
                "questions a node generates per round"
            )
        if local + external < 1:
            raise ConfigError(f"configuration {local}/{external}: a batch needs at least one group")
    if chosen.nodes < 2:
        raise ConfigError(
            "an experiment needs at least 2 nodes (4 or more: with 2, both train on the same batches)"
        )
    return chosen


def node_seed(seed: int, index: int) -> int:
    """Distinct per node and per experiment seed, so no two nodes of any run share a stream."""
    return 1000 * seed + index + 1


def manifest_data(profile: ExperimentProfile, mix: tuple[int, int], seed: int) -> dict[str, Any]:
    """The swarm manifest of one run (as `sapo.swarm.manifest.parse_manifest` reads it)."""
    local, external = mix
    return {
        "name": f"exp-{profile.name}-{run_name(mix, seed)}",
        "defaults": {
            "model": profile.model.format(seed=seed),
            "profile": profile.task_profile,
            "questions_per_round": profile.questions_per_round,
            "completions_per_question": profile.completions_per_question,
            "local_groups": local,
            "external_groups": external,
            # 8/0 still shares (its groups are simply never picked): the four configurations differ
            # only in I/J, not in what crosses the broker.
            "sharing": "all",
            "round_mode": "lockstep",
            "rounds": profile.rounds,
            "max_new_tokens": profile.max_new_tokens,
            "learning_rate": profile.learning_rate,
            "generator": dict(profile.generator),
            "sampler": dict(profile.sampler),
            "trainer": dict(profile.trainer),
        },
        "nodes": [{"id": f"node-{i + 1}", "seed": node_seed(seed, i)} for i in range(profile.nodes)],
    }
