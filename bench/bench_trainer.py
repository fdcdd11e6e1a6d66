"""One trainer step through our code path, with and without shared prompts, vs a bare torch loop.

Ours: `Trainer.apply` on a `TrainingBatch` (rows built from the protobuf, packed, micro-batched by prompt
length and token budget, GRPO loss with its metrics, AdamW step), each distinct prompt computed once
and its completions run on its key/value cache (`sapo.grpo.shared_prompt`). Unshared: the same with
`Trainer.share_prompts` off, every row carrying its whole prompt (the path gradient checkpointing
uses). Bare: the same rows, one group per forward pass as plain padded tensors, whole rows like
unshared (no logits for prompt positions), a vectorized log-softmax, the same clipped loss normalized
by the batch's completion tokens, backward, clip, AdamW. Same data, same precision, and literally the
same model and AdamW (one copy in memory: the lr is tiny, and the work per step does not depend on the
weights). The three rotate so machine noise hits all; the ratios bare/ours (target >= 0.95) and
unshared/ours (target: half of the matmul work sharing saves, `expected_speedup`) are printed with
PASS/FAIL on the ratio of minimums.
It restarts itself with the allocator setting the trainer service runs with (`sapo.malloc`), so that
every path allocates as the service does.

usage: python bench/bench_trainer.py [--model tiny:0] [--groups 4] [--completions 4] [--tokens 64]
    [--min-tokens 8] [--micro-batch-tokens 1024] [--precision fp32] [--repeats 5]

What it read on the tiny and the bundled 135M model, at each shape: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sapo.checkpoints import CheckpointStore
from sapo.convert import question_to_proto
from sapo.grpo.layout import TrainSample, pack
from sapo.grpo.logprobs import policy_logprobs
from sapo.malloc import restart_with_malloc_tunable
from sapo.models import BUNDLED_REF, load_model, tokenizer_fingerprint
from sapo.tasks import EASY_PROFILE, TaskStream, prompt_ids
from sapo.trainer import Precision, Trainer
from sapo.trainer.settings import TrainerSettings
from sapo.trainer.step import autocast
from sapo.v1 import batch_pb2, rollout_pb2
from sapo.wire import SCHEMA_VERSION

EPS_LOW, EPS_HIGH, MAX_GRAD_NORM, LR = 0.2, 0.28, 1.0, 1e-6


def build_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    groups: int,
    completions: int,
    tokens: tuple[int, int],
) -> batch_pb2.TrainingBatch:
    """Local groups of the easy profile's first questions; completions are random vocabulary tokens
    ending in EOS, `tokens` = (fewest, most) long, with behaviour log-probs from the model itself (a
    fresh, staleness-0 batch)."""
    gen = torch.Generator().manual_seed(0)
    eos = int(tokenizer.eos_token_id)
    batch = batch_pb2.TrainingBatch(schema_version=SCHEMA_VERSION, batch_id="bench/0", node_id="bench")
    for question in TaskStream(EASY_PROFILE, 1, "train").take(groups):
        prompt = prompt_ids(tokenizer, question)
        lengths = torch.randint(tokens[0], tokens[1] + 1, (completions,), generator=gen).tolist()
        ids = [[*torch.randint(100, 40_000, (n - 1,), generator=gen).tolist(), eos] for n in lengths]
        packed = pack([TrainSample(prompt, c, 0.0) for c in ids], pad_token_id=eos)
        with torch.no_grad():
            logprobs = policy_logprobs(model, packed).logprobs
        group = rollout_pb2.RolloutGroup(
            schema_version=SCHEMA_VERSION,
            group_id=str(uuid.uuid4()),
            node_id="bench",
            question=question_to_proto(question),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            sampling=rollout_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=tokens[1]),
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


def model_tokens(rows: list[TrainSample], *, shared: bool) -> int:
    """Tokens through the model's layers in one step: each row whole, or each distinct prompt once
    plus every completion (what sharing prompts saves, before padding)."""
    completions = sum(len(r.completion_ids) for r in rows)
    if shared:
        return completions + sum(len(p) for p in {tuple(r.prompt_ids) for r in rows})
    return completions + sum(len(r.prompt_ids) for r in rows)


def expected_speedup(model: PreTrainedModel, rows: list[TrainSample]) -> float:
    """Step time unshared / shared if time were matmul work: layer weights see every token through the
    model, the vocabulary projection only scored completion tokens in both paths (so on a model whose
    layers are small beside its vocabulary, sharing saves little). Attention is left out."""
    head = int(model.config.vocab_size) * int(model.config.hidden_size)
    tied = bool(model.config.tie_word_embeddings)
    layers = sum(p.numel() for p in model.parameters()) - head * (1 if tied else 2)  # less the vocab
    scored = head * sum(len(r.completion_ids) for r in rows)
    unshared = layers * model_tokens(rows, shared=False) + scored
    return float(unshared / (layers * model_tokens(rows, shared=True) + scored))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=BUNDLED_REF)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="longest completion")
    parser.add_argument(
        "--min-tokens", type=int, default=None, help="shortest completion (default: --tokens)"
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    restart_with_malloc_tunable()  # the trainer service's allocator (sapo.malloc)
    precision: Precision = args.precision
    lengths = (args.min_tokens or args.tokens, args.tokens)

    settings = TrainerSettings(
        node_id="bench",
        lr=LR,
        precision=precision,
        max_grad_norm=MAX_GRAD_NORM,
        micro_batch_tokens=args.micro_batch_tokens,
    )
    model, tokenizer = load_model(args.model)
    batch = build_batch(model, tokenizer, args.groups, args.completions, lengths)
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

    def ours(share_prompts: bool) -> None:
        trainer.share_prompts = share_prompts
        for bg in batch.groups:  # sampled by the current version: pi_old = behaviour, as in bare
            bg.group.policy_version = trainer.version
        trainer.apply(batch)

    def bare() -> None:
        bare_step(trainer.model, trainer.optimizer, groups, pad, precision)

    runs: dict[str, Callable[[], None]] = {
        "ours": lambda: ours(True),
        "unshared": lambda: ours(False),
        "bare": bare,
    }
    tokens = sum(len(r.completion_ids) for r in rows)
    print(
        f"model {args.model}, {precision}, {len(rows)} rows, {tokens} completion tokens "
        f"({lengths[0]}-{lengths[1]} per row), prompts {sorted({len(r.prompt_ids) for r in rows})} tokens, "
        f"micro_batch_tokens {args.micro_batch_tokens}, {torch.get_num_threads()} threads"
    )
    saving = model_tokens(rows, shared=False) / model_tokens(rows, shared=True)
    expected = expected_speedup(trainer.model, rows)
    print(
        f"tokens through the model: {model_tokens(rows, shared=False)} unshared, "
        f"{model_tokens(rows, shared=True)} shared ({saving:.2f}x fewer; {expected:.2f}x less matmul work)"
    )
    for run in runs.values():  # warm-up: allocator, oneDNN kernels
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(args.repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate so noise hits all
            started = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - started)
    for name, values in times.items():
        spread = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name}: median {statistics.median(values):.3f} s, min {min(values):.3f} s  ({spread})")
    # On a shared machine noise only ever adds time, so the ratio of minimums is the steadier estimate.
    report("bare/ours", times["bare"], times["ours"], 0.95)
    # Sharing should turn at least half of the work it saves into time (the per-row cache copy, the
    # second forward call and attention over the cached prompt are what the estimate leaves out).
    report("unshared/ours", times["unshared"], times["ours"], 1 + (expected - 1) / 2)


def report(name: str, slower: list[float], faster: list[float], target: float) -> None:
    median = statistics.median(slower) / statistics.median(faster)
    best = min(slower) / min(faster)
    verdict = "PASS" if best >= target else "FAIL"
    print(f"ratio {name}: {median:.3f} of medians, {best:.3f} of minimums (target >= {target:.2f}) {verdict}")


if __name__ == "__main__":
    main()
