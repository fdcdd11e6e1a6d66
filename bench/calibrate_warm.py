"""Calibrate the ``warm:<seed>`` recipe: pre-RL reward per SFT step count, then a short plain-GRPO check.

``--tokenizer bpe`` calibrates ``warm-bpe:<seed>`` instead: the same recipe with the project's BPE
tokenizer (``sapo.models.bpe``).

One SFT run to the largest candidate step count; the recipe's learning rate is constant after warm-up,
so the model at step k *is* the k-step recipe (``sapo.models.warm``) and every candidate is measured in
the same run. For each candidate: build seconds (SFT only, evaluations excluded), mean reward at
temperature 1.0 on a node's train stream and on the held-out eval split (sampled with the real
``TransformersBackend``, scored with ``sapo.tasks.score``), reward per task, the share of completions
that close the answer tag, and the share of question groups whose rewards differ (GRPO signal).

Then plain GRPO from the chosen candidate, local groups only: each round takes 8 questions of node 0's
train stream, samples 8 completions each, drops zero-variance groups, and takes one AdamW step on
``sapo.grpo`` (pack / policy_logprobs / grpo_loss), one micro-batch per group as the trainer does (rows
of one prompt length: see ``sapo.trainer.step.plan_micro_batches``). Prints reward per round, its mean
per 10 rounds, and the held-out reward before and after. 40 rounds by default: 8 questions per round make
the per-round reward noisy (+-0.1), and after 20 rounds the held-out gain was still within the noise of a
64-question measurement (measured), after 40 it was not.

    OMP_NUM_THREADS=1 .venv/bin/python bench/calibrate_warm.py [--steps 100,200,400] [--chosen 200]
        [--tokenizer bundled|bpe]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: 2 shared cores, oversubscription is slower
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import dataclasses
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from sapo.backends import SamplingConfig, TransformersBackend
from sapo.experiment.evaluate import sample_and_score
from sapo.grpo.advantages import group_advantages, has_signal
from sapo.grpo.layout import TrainSample, pack
from sapo.grpo.logprobs import policy_logprobs
from sapo.grpo.loss import grpo_loss
from sapo.models import build_tiny_model, project_tokenizer
from sapo.models.warm import WARM_PROFILE, WarmRecipe, parse_warm_ref, sft_stream, train_warm_model
from sapo.tasks import (
    STOP_STRINGS,
    QuestionRecord,
    TaskStream,
    prompt_ids,
    score,
)
from sapo.tasks.records import Split

NODE_SEED = 0
CALIBRATION_SEED = 1234
"""Sampling seed of every measurement (the numbers in sapo.models.warm were taken with it)."""
"""The node whose streams are measured (its train stream is not the SFT stream: different seed)."""

KINDS = {"bundled": "warm", "bpe": "warm-bpe"}
"""--tokenizer -> the warm reference kind it calibrates."""


@dataclass(frozen=True)
class Measured:
    """Rewards of one model on one question set, sampled at temperature 1.0."""

    mean: float
    per_task: dict[str, float]
    signal_fraction: float
    tagged_fraction: float


def questions(split: Split, count: int) -> list[QuestionRecord]:
    return TaskStream(WARM_PROFILE, NODE_SEED, split).take(count)


def measure(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    records: Sequence[QuestionRecord],
    *,
    samples: int,
    max_new_tokens: int,
) -> Measured:
    """Sample ``samples`` completions per question (fixed seed) and score them."""
    scored = sample_and_score(
        model, tokenizer, records, samples=samples, max_new_tokens=max_new_tokens, seed=CALIBRATION_SEED
    )
    per_task: dict[str, list[float]] = defaultdict(list)
    for item in scored:
        per_task[item.record.task].extend(item.rewards)
    every = [r for values in per_task.values() for r in values]
    texts = [t for item in scored for t in item.texts]
    return Measured(
        mean=statistics.fmean(every),
        per_task={task: statistics.fmean(values) for task, values in sorted(per_task.items())},
        signal_fraction=statistics.fmean(has_signal(item.rewards) for item in scored),
        tagged_fraction=statistics.fmean("</answer>" in t for t in texts),
    )


@dataclass(frozen=True)
class Candidate:
    steps: int
    build_seconds: float
    loss: float
    train: Measured
    held_out: Measured
    seen: float
    """Share of the measured train-split questions whose exact text the SFT had seen by this step."""


def recipe(args: argparse.Namespace) -> WarmRecipe:
    """The recipe under test: the size from --size (as in warm:<seed>:<size>:<steps>), lr from --lr."""
    _, parsed = parse_warm_ref(f"{args.kind}:{args.seed}:{args.size}:{args.chosen}")
    return dataclasses.replace(parsed, learning_rate=args.lr)


def calibrate(
    tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace
) -> tuple[list[Candidate], dict[str, torch.Tensor]]:
    """Train once to the last candidate, measuring each candidate step count on the way."""
    steps = sorted(args.steps)
    train_set, eval_set = questions("train", args.questions), questions("eval", args.questions)
    candidates: list[Candidate] = []
    chosen_state: dict[str, torch.Tensor] = {}
    longest = dataclasses.replace(recipe(args), steps=steps[-1])
    sft_texts = [r.text for r in sft_stream(args.seed).take(longest.steps * longest.batch_size)]
    clock = {"start": time.perf_counter(), "paused": 0.0}

    def on_step(step: int, model: LlamaForCausalLM, loss: float) -> None:
        if step % 50 == 0:
            print(f"  sft step {step:4d}  loss {loss:.3f}", flush=True)
        if step not in steps:
            return
        paused = time.perf_counter()
        built = paused - clock["start"] - clock["paused"]
        model.eval()  # type: ignore[no-untyped-call]
        train = measure(model, tokenizer, train_set, samples=args.samples, max_new_tokens=args.max_new_tokens)
        held_out = measure(
            model, tokenizer, eval_set, samples=args.samples, max_new_tokens=args.max_new_tokens
        )
        model.train()
        seen_texts = set(sft_texts[: step * longest.batch_size])
        seen = statistics.fmean(r.text in seen_texts for r in train_set)
        candidates.append(Candidate(step, built, loss, train, held_out, seen))
        if step == args.chosen:
            chosen_state.update(copy.deepcopy(model.state_dict()))
        print(f"  measured step {step}: train {train.mean:.3f}  eval {held_out.mean:.3f}", flush=True)
        clock["paused"] += time.perf_counter() - paused

    train_warm_model(tokenizer, args.seed, longest, callback=on_step)
    return candidates, chosen_state


def print_table(candidates: Sequence[Candidate], args: argparse.Namespace) -> None:
    """Two rows per candidate: the node's train stream and the held-out eval split."""
    tasks = sorted(candidates[0].train.per_task)
    print(
        f"\n{args.kind}:{args.seed}:{args.size}:<steps>, lr {args.lr}; {args.questions} questions x "
        f"{args.samples} samples, T=1.0, <= {args.max_new_tokens} new tokens; node {NODE_SEED} streams"
    )
    header = ["steps", "build_s", "loss", "split", "reward", *(t.split("_")[0][:8] for t in tasks)]
    print(" | ".join(f"{h:>8}" for h in [*header, "signal", "tagged", "seen"]))
    for c in candidates:
        for split, measured, seen in (("train", c.train, c.seen), ("eval", c.held_out, 0.0)):
            cells = [
                f"{c.steps:8d}",
                f"{c.build_seconds:8.1f}",
                f"{c.loss:8.3f}",
                f"{split:>8}",
                f"{measured.mean:8.3f}",
                *(f"{measured.per_task.get(t, math.nan):8.3f}" for t in tasks),
                f"{measured.signal_fraction:8.2f}",
                f"{measured.tagged_fraction:8.2f}",
                f"{seen:8.2f}",
            ]
            print(" | ".join(cells))


def grpo_round(
    model: LlamaForCausalLM,
    backend: TransformersBackend,
    optimizer: torch.optim.Optimizer,
    records: Sequence[QuestionRecord],
    params: SamplingConfig,
) -> tuple[float, int]:
    """One local-only GRPO round; returns (mean reward of the round's samples, groups trained on)."""
    tokenizer = backend.tokenizer
    prompts = [prompt_ids(tokenizer, r) for r in records]
    model.eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        sampled = backend.generate(prompts, params)
    rewards: list[float] = []
    groups: list[list[TrainSample]] = []
    for record, prompt, group in zip(records, prompts, sampled, strict=True):
        group_rewards = [score(record, s.text, prefilled=True) for s in group]
        rewards += group_rewards
        if has_signal(group_rewards):
            advantages = group_advantages(group_rewards)
            groups.append(
                [TrainSample(prompt, s.token_ids, a) for s, a in zip(group, advantages, strict=True)]
            )
    groups = [[s for s in g if s.completion_ids] for g in groups]
    groups = [g for g in groups if g]
    if groups:
        total = sum(len(s.completion_ids) for g in groups for s in g)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        model.train()
        optimizer.zero_grad(set_to_none=True)
        for group_samples in groups:  # one micro-batch per prompt length, as the trainer does
            batch = pack(group_samples, pad)
            scored = policy_logprobs(model, batch)
            loss, _ = grpo_loss(scored.logprobs, batch.advantages, batch.completion_mask, total)
            loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        model.eval()  # type: ignore[no-untyped-call]
    return statistics.fmean(rewards), len(groups)


def grpo_check(
    tokenizer: PreTrainedTokenizerBase, state: dict[str, torch.Tensor], args: argparse.Namespace
) -> None:
    """Plain GRPO from the chosen warm model; reward per round and held-out reward before / after."""
    model = build_tiny_model(tokenizer, seed=args.seed, spec=recipe(args).spec)
    model.load_state_dict(state)
    eval_set = questions("eval", args.questions)
    before = measure(model, tokenizer, eval_set, samples=args.samples, max_new_tokens=args.max_new_tokens)
    backend = TransformersBackend(model, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.rl_lr, weight_decay=0.0)
    stream = TaskStream(WARM_PROFILE, NODE_SEED, "train")
    print(
        f"\nplain GRPO from {args.kind}:{args.seed} at {args.chosen} steps, lr {args.rl_lr}, 8 x 8 per round"
    )
    curve: list[float] = []
    for round_ in range(args.rounds):
        start = time.perf_counter()
        params = SamplingConfig(
            max_new_tokens=args.max_new_tokens, num_samples=8, temperature=1.0, seed=round_, stop=STOP_STRINGS
        )
        reward, trained = grpo_round(model, backend, optimizer, stream.take(8), params)
        curve.append(reward)
        print(
            f"  round {round_:2d}  reward {reward:.3f}  groups with signal {trained}/8"
            f"  {time.perf_counter() - start:.1f} s",
            flush=True,
        )
    after = measure(model, tokenizer, eval_set, samples=args.samples, max_new_tokens=args.max_new_tokens)
    blocks = [curve[i : i + 10] for i in range(0, len(curve), 10)]
    means = " ".join(f"{statistics.fmean(block):.3f}" for block in blocks)
    tasks = ", ".join(f"{t} {before.per_task[t]:.2f} -> {after.per_task[t]:.2f}" for t in before.per_task)
    print(f"  round reward per 10 rounds: {means}")
    print(f"  held-out reward {before.mean:.3f} -> {after.mean:.3f} ({tasks})")


def _default_size() -> str:
    spec = WarmRecipe().spec
    return f"{spec.hidden_size}x{spec.num_hidden_layers}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", choices=sorted(KINDS), default="bundled", help="tokenizer family")
    parser.add_argument("--seed", type=int, default=0, help="warm model seed")
    parser.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")], default=[100, 200, 400])
    parser.add_argument("--chosen", type=int, default=WarmRecipe().steps, help="candidate for the GRPO check")
    parser.add_argument("--size", default=_default_size(), help="<hidden>x<layers>")
    parser.add_argument("--lr", type=float, default=WarmRecipe().learning_rate, help="SFT learning rate")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rl-lr", type=float, default=1e-3)
    args = parser.parse_args()
    args.kind = KINDS[args.tokenizer]
    if args.chosen not in args.steps:
        parser.error(f"--chosen {args.chosen} must be one of --steps {args.steps}")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    tokenizer = project_tokenizer(f"{args.kind}:{args.seed}")
    candidates, state = calibrate(tokenizer, args)
    print_table(candidates, args)
    if args.rounds:
        grpo_check(tokenizer, state, args)


if __name__ == "__main__":
    main()
