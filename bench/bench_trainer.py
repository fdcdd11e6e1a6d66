"""One trainer step through our code path vs a bare torch loop computing the same loss, in the same run.

Ours: `Trainer.apply` on a `TrainingBatch` (rows built from the protobuf, packed, micro-batched by prompt
length and token budget, GRPO loss with its metrics, AdamW step). Bare: the same rows, one group per
forward pass as plain padded tensors (the same work as ours: no logits for prompt positions), a
vectorized log-softmax, the same clipped loss normalized by the batch's completion tokens, backward,
clip, AdamW. Same data, same precision, and literally the same model and AdamW (one copy in memory:
the lr is tiny, and the work per step does not depend on the weights). The two alternate so machine
noise hits both; the ratio bare/ours is printed (target >= 0.95).

usage: python bench/bench_trainer.py [--model tiny:0] [--groups 4] [--completions 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.checkpoints import CheckpointStore
from sapo.convert import question_to_proto
from sapo.grpo import TrainSample, pack, policy_logprobs
from sapo.models import BUNDLED_REF, load_model, tokenizer_fingerprint
from sapo.tasks import EASY_PROFILE, TaskStream, prompt_ids
from sapo.trainer import Precision, Trainer
from sapo.trainer.settings import TrainerSettings
from sapo.trainer.step import autocast
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import SCHEMA_VERSION

EPS_LOW, EPS_HIGH, MAX_GRAD_NORM, LR = 0.2, 0.28, 1.0, 1e-6


def build_batch(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, groups: int, completions: int, tokens: int
) -> batch_pb2.TrainingBatch:
    """Local groups of the easy profile's first questions; completions are random vocabulary tokens
    ending in EOS, with behaviour log-probs from the model itself (a fresh, staleness-0 batch)."""
    gen = torch.Generator().manual_seed(0)
    eos = int(tokenizer.eos_token_id)
    batch = batch_pb2.TrainingBatch(schema_version=SCHEMA_VERSION, batch_id="bench/0", node_id="bench")
    for question in TaskStream(EASY_PROFILE, 1, "train").take(groups):
        prompt = prompt_ids(tokenizer, question)
        ids = [
            [*torch.randint(100, 40_000, (tokens - 1,), generator=gen).tolist(), eos]
            for _ in range(completions)
        ]
        packed = pack([TrainSample(prompt, c, 0.0) for c in ids], pad_token_id=eos)
        with torch.no_grad():
            logprobs = policy_logprobs(model, packed).logprobs
        group = rollout_pb2.RolloutGroup(
            schema_version=SCHEMA_VERSION,
            group_id=str(uuid.uuid4()),
            node_id="bench",
            question=question_to_proto(question),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=tokens),
            prompt_token_ids=prompt,
            completions=[
                rollout_pb2.Completion(
                    text="",
                    token_ids=c,
                    logprobs=logprobs[i][packed.completion_mask[i]].tolist(),
                    finish_reason=rollout_pb2.FINISH_REASON_STOP,
                )
                for i, c in enumerate(ids)
            ],
        )
        rewards = [float(i % 2) for i in range(completions)]
        mean = sum(rewards) / len(rewards)
        batch.groups.add(
            group=group,
            source=batch_pb2.GROUP_SOURCE_LOCAL,
            rewards=rewards,
            advantages=[r - mean for r in rewards],
        )
    return batch


def bare_loss(
    model: PreTrainedModel, rows: list[TrainSample], total: int, pad: int, precision: Precision
) -> Tensor:
    """The clipped loss of rows sharing one prompt, written directly: padded tensors, one forward from
    the first completion position on, a vectorized log-softmax, no metrics."""
    prompt = len(rows[0].prompt_ids)
    width = prompt + max(len(r.completion_ids) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    behaviour = torch.zeros((len(rows), width - prompt))
    for i, r in enumerate(rows):
        ids[i, : prompt + len(r.completion_ids)] = torch.tensor([*r.prompt_ids, *r.completion_ids])
        mask[i, : prompt + len(r.completion_ids)] = 1
        behaviour[i, : len(r.completion_ids)] = torch.tensor(list(r.behaviour_logprobs or ()))
    with autocast(torch.device("cpu"), precision):
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=torch.arange(width).expand_as(ids),
            logits_to_keep=width - prompt + 1,
            use_cache=False,
        ).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, prompt:, None]).squeeze(-1)
    sel = mask[:, prompt:].bool()
    ratio = torch.exp(torch.where(sel, logp - behaviour, 0.0))
    advantages = torch.tensor([r.advantage for r in rows]).unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    return torch.where(sel, per_token, 0.0).sum() / total


def bare_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    groups: list[list[TrainSample]],
    pad: int,
    precision: Precision,
) -> None:
    """One group per forward pass (no padding waste, as ours), loss over the whole batch, one update."""
    total = sum(len(r.completion_ids) for rows in groups for r in rows)
    optimizer.zero_grad(set_to_none=True)
    for rows in groups:
        bare_loss(model, rows, total, pad, precision).backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=BUNDLED_REF)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    precision: Precision = args.precision

    settings = TrainerSettings(node_id="bench", lr=LR, precision=precision, max_grad_norm=MAX_GRAD_NORM)
    model, tokenizer = load_model(args.model)
    batch = build_batch(model, tokenizer, args.groups, args.completions, args.tokens)
    trainer = Trainer(
        model,
        tokenizer,
        model_ref=args.model,
        node_id="bench",
        store=CheckpointStore(Path(tempfile.mkdtemp(prefix="bench-trainer-"))),
        optim=settings.optim_config(),
        step=settings.step_config(),
        max_sequence_tokens=4096,
    )
    rows = [r.sample for r in trainer.builder.build(batch, 0).rows]
    per_group = args.completions
    groups = [rows[i : i + per_group] for i in range(0, len(rows), per_group)]
    pad = trainer.pad_token_id

    def ours() -> None:
        for bg in batch.groups:  # sampled by the current version: pi_old = behaviour, as in bare
            bg.group.policy_version = trainer.version
        trainer.apply(batch)

    def bare() -> None:
        bare_step(trainer.model, trainer.optimizer, groups, pad, precision)

    tokens = sum(len(r.completion_ids) for r in rows)
    print(
        f"model {args.model}, {precision}, {len(rows)} rows, {tokens} completion tokens, "
        f"prompts {sorted({len(r.prompt_ids) for r in rows})} tokens, {torch.get_num_threads()} threads"
    )
    ours()  # warm-up: allocator, oneDNN kernels
    bare()
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    for rep in range(args.repeats):
        order = [("ours", ours), ("bare", bare)] if rep % 2 == 0 else [("bare", bare), ("ours", ours)]
        for name, run in order:
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    for name, values in times.items():
        runs = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name}: median {statistics.median(values):.3f} s, min {min(values):.3f} s  ({runs})")
    median = statistics.median(times["bare"]) / statistics.median(times["ours"])
    best = min(times["bare"]) / min(times["ours"])
    # On a shared machine noise only ever adds time, so the ratio of minimums is the steadier estimate.
    print(f"ratio bare/ours: {median:.3f} of medians, {best:.3f} of minimums (target >= 0.95)")


if __name__ == "__main__":
    main()
