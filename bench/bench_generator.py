"""Throughput of our transformers backend vs a bare ``model.generate`` on the same batch.

Bundled SmolLM2-135M in bf16 on CPU, 8 chat questions x 8 samples, the same sampling settings and seed
for both, runs alternated so machine noise hits both sides alike. Our backend adds behaviour logprobs,
per-row stop tracking, trimming and decoding on top of ``generate``; the target is ours/bare >= 0.95.
bf16 is only faster than fp32 on CPUs with native bf16 matmul (AVX-512 BF16 / AMX); on AVX2-only
CPUs it is several times slower, so ``--dtype fp32`` is offered for those.
Both get the same seed, but ours draws each row from its own seeded generator (`_RowSampler` in
`sapo.backends.hf`) where ``generate`` draws from torch's global one, so they sample different
tokens. The ratio is of tokens per second, and each side's token count is printed with it: rows that
end early on EOS are shorter and cheaper per token, so read the counts before the ratio.

    .venv/bin/python bench/bench_generator.py [--rounds 3] [--max-new-tokens 64] [--dtype fp32] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.backends import SamplingConfig, TransformersBackend
from sapo.backends.hf import left_pad
from sapo.models import BUNDLED_REF, load_model

TARGET_RATIO = 0.95
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SYSTEM = "You are a careful assistant. Think step by step, then give the final answer."
QUESTIONS = (
    "What is 17 * 23 - 45?",
    "Convert the decimal number 156 to base 2.",
    "Simplify the fraction 84/126 to lowest terms.",
    "If today is Tuesday, what day of the week will it be in 100 days?",
    "Is 2024 a leap year? Explain why.",
    "What is 3.75 + 12.125 - 0.5?",
    "If A is true and B is false, what is the value of (A and not B) or B?",
    "How many minutes are there in 3 days and 7 hours?",
)


def chat_prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """The questions rendered with the model's chat template (system turn included)."""
    prompts = []
    for question in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(str(text), add_special_tokens=False))
    return prompts


def run_bare(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], params: SamplingConfig, eos: list[int], pad: int
) -> list[list[int]]:
    """Plain ``generate`` with the same inputs and settings; rows trimmed after their first EOS."""
    input_ids, mask = left_pad(prompts, pad, model.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cast(int, params.seed))
        out = cast(Any, model).generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.num_samples,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    rows = []
    for row in out[:, input_ids.shape[1] :].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:end])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating (bare, ours) pairs to time")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8, help="completions per question (L)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="bf16", help="bf16 needs native CPU support to pay off"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(BUNDLED_REF, dtype=DTYPES[args.dtype])
    backend = TransformersBackend(model, tokenizer)
    eos = cast(list[int], model.generation_config.eos_token_id)
    pad = cast(int, model.generation_config.pad_token_id)
    prompts = chat_prompts(tokenizer)
    params = SamplingConfig(max_new_tokens=args.max_new_tokens, num_samples=args.samples, seed=args.seed)
    print(
        f"{args.dtype}, torch threads {torch.get_num_threads()}, "
        f"{len(prompts)} prompts x {args.samples} samples, "
        f"prompt tokens {min(map(len, prompts))}-{max(map(len, prompts))}, "
        f"max_new_tokens {args.max_new_tokens}"
    )

    warm = SamplingConfig(max_new_tokens=4, num_samples=2, seed=0)
    backend.generate(prompts, warm)
    run_bare(model, prompts, warm, eos, pad)

    times: dict[str, list[float]] = {"bare": [], "ours": []}
    tokens: dict[str, int] = {}
    for round_index in range(args.rounds):
        order = ("bare", "ours") if round_index % 2 == 0 else ("ours", "bare")
        for side in order:
            start = time.perf_counter()
            if side == "bare":
                rows = run_bare(model, prompts, params, eos, pad)
            else:
                rows = [list(s.token_ids) for g in backend.generate(prompts, params) for s in g]
            times[side].append(time.perf_counter() - start)
            tokens[side] = sum(map(len, rows))
            print(
                f"round {round_index} {side}: {tokens[side]} tokens in {times[side][-1]:.2f} s "
                f"= {tokens[side] / times[side][-1]:.0f} tok/s"
            )

    rate = {side: tokens[side] / statistics.median(times[side]) for side in times}
    ratio = rate["ours"] / rate["bare"]
    print(
        f"median tok/s: bare {rate['bare']:.0f} ({tokens['bare']} tokens a round), "
        f"ours {rate['ours']:.0f} ({tokens['ours']} tokens a round)"
    )
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print(f"{verdict}: ours {ratio:.3f} x bare generate's tokens/s (target >= {TARGET_RATIO})")


if __name__ == "__main__":
    main()
