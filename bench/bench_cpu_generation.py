"""CPU sampling speed of the bundled 135M model: what the generator runs by default against the variants
one could run instead, all in one process, alternated so machine noise hits every variant alike.

Variants (each a `TransformersBackend` over its own copy of SmolLM2-135M-Instruct):

- `baseline`: what a generator runs by default (fp32, transformers' SDPA attention, KV cache, each
  prompt read once and its cache shared by its L completions, 1 thread unless `--threads`: a node's
  processes share few cores, so the swarm launcher pins torch to one thread);
- `prompt-per-row`: the baseline reading each prompt once per completion, as `generate`'s
  `num_return_sequences` does (what the generator ran before);
- `concat-cache`: the baseline with the shared prompt cache growing by concatenation, as transformers'
  `DynamicLayer` does (what the generator ran before `ReservedLayer`: every decode step copied every
  row's cache);
- `generate-decode`: the baseline with transformers' `generate` decoding (copying each step's logits
  and taking the maximum of one-hot scores the seeded draw wrote) instead of the backend's own loop;
- `eager-attention`: transformers' plain attention instead of SDPA;
- `int8-dynamic`: `SAPO_GENERATOR_QUANTIZATION=int8-dynamic`, linear layers of a copy quantized to int8
  (torch dynamic quantization); the policy's fp32 weights stay what the trainer and reloads see;
- `bf16`: `SAPO_GENERATOR_DTYPE=bfloat16`, the whole model in bf16 (fast only on CPUs with native
  bf16 matmuls: AVX512-BF16 or AMX);
- `threads-2`: the baseline with two intra-op threads (only a win when the core is otherwise idle).

The prompts are the generator's own (the first `--questions` of a node's easy-task stream rendered
with the one-shot chat template: 86-354 tokens for the default 4). Every variant samples the same
prompts with the same per-prompt seeds. For `int8-dynamic` and `bf16` the bench also reports how far
their behaviour log-probs are from the fp32 policy's on the tokens they sampled (teacher-forced), i.e.
the importance weights the trainer applies: the price of the speed. Targets: >= 1.5x the baseline's
tokens/s (speed) and a mean |log pi - log mu| <= 0.1 nats per sampled token (fidelity: a copy further
away than that is a different policy, and the trainer's truncated importance weights then carry most
of the correction). The PASS/FAIL lines are `int8-dynamic`'s and `bf16`'s, one per target; for the
variants that are what ran before (`prompt-per-row`, `concat-cache`, `generate-decode`) it prints how
many times their tokens/s the baseline reads, and whether `generate-decode` drew the same tokens.

    .venv/bin/python bench/bench_cpu_generation.py [--rounds 3] [--questions 4] [--samples 4]

What each variant read, and which became the default: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import PreTrainedModel

from sapo.backends import Sample, SamplingConfig, TransformersBackend
from sapo.backends.hf import INT8_DYNAMIC
from sapo.models import BUNDLED_REF, load_model
from sapo.tasks import EASY_PROFILE, TaskStream
from sapo.tasks.prompt import prompt_ids

TARGET = 1.5
MAX_GAP = 0.1
BF16 = "bf16"
PER_ROW = "prompt-per-row"
CONCAT = "concat-cache"
GENERATE = "generate-decode"


def eager(model: PreTrainedModel) -> PreTrainedModel:
    model.set_attn_implementation("eager")
    return model


def variants(threads: int) -> dict[str, tuple[Callable[[], TransformersBackend], int, str]]:
    """name -> (backend factory, torch threads, quantization)."""

    def backend(
        prepare: Callable[[PreTrainedModel], PreTrainedModel],
        quantization: str = "",
        *,
        dtype: torch.dtype = torch.float32,
        share_prompt: bool = True,
        reserve_cache: bool = True,
        own_decode: bool = True,
    ) -> TransformersBackend:
        model, tokenizer = load_model(BUNDLED_REF, dtype=dtype)
        return TransformersBackend(
            prepare(model),
            tokenizer,
            quantization=quantization,
            share_prompt=share_prompt,
            reserve_cache=reserve_cache,
            own_decode=own_decode,
        )

    same: Callable[[PreTrainedModel], PreTrainedModel] = lambda m: m  # noqa: E731 - a one-line identity
    return {
        "baseline": (lambda: backend(same), threads, ""),
        PER_ROW: (lambda: backend(same, share_prompt=False), threads, ""),
        CONCAT: (lambda: backend(same, reserve_cache=False), threads, ""),
        GENERATE: (lambda: backend(same, own_decode=False), threads, ""),
        "eager-attention": (lambda: backend(eager), threads, ""),
        INT8_DYNAMIC: (lambda: backend(same, INT8_DYNAMIC), threads, INT8_DYNAMIC),
        BF16: (lambda: backend(same, dtype=torch.bfloat16), threads, ""),
        "threads-2": (lambda: backend(same), 2, ""),
    }


def policy_gap(
    policy: PreTrainedModel, prompts: list[list[int]], groups: list[list[Sample]]
) -> tuple[float, float, float]:
    """(mean |log pi - log mu|, mean pi/mu, fraction of tokens with pi/mu outside [0.8, 1.28]) over the
    sampled tokens: mu the sampler's recorded log-probs, pi the fp32 policy teacher-forced (T = 1)."""
    gaps: list[float] = []
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            ids = torch.tensor([prompt + list(sample.token_ids)])
            with torch.no_grad():
                logits = policy(ids).logits[0, len(prompt) - 1 : -1].float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(sample.token_ids)[:, None])
            gaps += (logprobs.squeeze(1) - torch.tensor(sample.logprobs)).tolist()
    ratios = [math.exp(g) for g in gaps]
    outside = sum(1 for r in ratios if not 0.8 <= r <= 1.28) / len(ratios)
    return statistics.fmean(abs(g) for g in gaps), statistics.fmean(ratios), outside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over every variant")
    parser.add_argument("--questions", type=int, default=4, help="prompts per call (B)")
    parser.add_argument("--samples", type=int, default=4, help="completions per question (L)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the baseline")

    parser.add_argument(
        "--without", default="", help="comma-separated variants to leave out (the baseline always runs)"
    )
    args = parser.parse_args()
    left_out = set(filter(None, args.without.split(","))) - {"baseline"}
    chosen = {name: v for name, v in variants(args.threads).items() if name not in left_out}
    built = {name: (factory(), threads, q) for name, (factory, threads, q) in chosen.items()}
    tokenizer = built["baseline"][0].tokenizer
    # The generator's own prompts (easy tasks, one-shot chat template: ~90-390 tokens), as it renders them.
    stream = TaskStream(EASY_PROFILE, node_seed=1, split="train")
    prompts = [list(prompt_ids(tokenizer, next(stream))) for _ in range(args.questions)]
    seeds = list(range(len(prompts)))
    print(
        f"{len(prompts)} prompts ({', '.join(str(len(p)) for p in prompts)} tokens) x {args.samples} samples"
        f" x {args.max_new_tokens} new tokens, fp32,"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    times: dict[str, list[float]] = {name: [] for name in built}
    tokens: dict[str, int] = {}
    last: dict[str, list[list[Sample]]] = {}
    for round_index in range(args.rounds + 1):  # pass 0 warms every variant up and is not timed
        names = list(built) if round_index % 2 == 0 else list(reversed(built))
        for name in names:
            backend, threads, quantization = built[name]
            torch.set_num_threads(threads)
            params = SamplingConfig(
                max_new_tokens=args.max_new_tokens if round_index else 4,
                num_samples=args.samples,
                quantization=quantization,
            )
            start = time.perf_counter()
            groups = backend.generate(prompts, params, seeds=seeds)
            elapsed = time.perf_counter() - start
            if round_index:
                times[name].append(elapsed)
                tokens[name] = sum(len(s.token_ids) for g in groups for s in g)
                last[name] = groups
    torch.set_num_threads(args.threads)
    rate = {name: tokens[name] / statistics.median(times[name]) for name in built}
    for name in built:
        print(
            f"{name:>16}: median {statistics.median(times[name]):6.2f} s, {rate[name]:6.1f} tok/s,"
            f" {rate[name] / rate['baseline']:.2f}x baseline"
        )
    if PER_ROW in rate:
        print(
            f"the prompt read once per question: {rate['baseline'] / rate[PER_ROW]:.2f}x {PER_ROW}'s tokens/s"
        )
    if CONCAT in rate:
        print(
            f"room reserved in the prompt cache: {rate['baseline'] / rate[CONCAT]:.2f}x {CONCAT}'s tokens/s"
        )
    if GENERATE in rate:
        same = [[s.token_ids for s in g] for g in last[GENERATE]] == [
            [s.token_ids for s in g] for g in last["baseline"]
        ]
        print(
            f"the backend's own decode loop: {rate['baseline'] / rate[GENERATE]:.2f}x {GENERATE}'s tokens/s"
            f" ({'the same' if same else 'OTHER'} tokens)"
        )
    policy = built["baseline"][0].model  # fp32: what the trainer holds
    for name in (n for n in (INT8_DYNAMIC, BF16) if n in built):
        gap, ratio, outside = policy_gap(policy, prompts, last[name])
        print(
            f"{name} vs the fp32 policy on its own samples: mean |log pi - log mu| {gap:.3f},"
            f" mean pi/mu {ratio:.3f}, {outside:.1%} of tokens outside [0.8, 1.28] (the trainer's IS weights)"
        )
        speedup = rate[name] / rate["baseline"]
        print(
            f"{'PASS' if speedup >= TARGET else 'FAIL'}: {name} {speedup:.2f}x the baseline's tokens/s"
            f" (target >= {TARGET})"
        )
        print(
            f"{'PASS' if gap <= MAX_GAP else 'FAIL'}: {name} {gap:.3f} nats per token from the policy"
            f" (target <= {MAX_GAP})"
        )


if __name__ == "__main__":
    main()
