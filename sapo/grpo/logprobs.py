"""Per-token log-probs and entropy of the sampled tokens, aligned with the input ids.

A causal LM's logits at position t are its distribution over token t + 1, so the log-prob of token t
is read from the logits at t - 1. Results are returned as (B, L) tensors aligned with `input_ids`
(value at t belongs to token t; 0 where nothing was computed) so they line up with the completion
mask of `sapo.grpo.layout.PackedBatch` without any further shifting by callers.

Logits are divided by the sampling temperature first: the behaviour log-probs a sampler reports are
those of the tempered distribution it drew from, and the ratios in the loss must compare like with
like (TRL does the same in its fused LM head).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from sapo.grpo.layout import PackedBatch


class TokenLogprobs(NamedTuple):
    """logprobs: (B, L) with grad; entropy: (B, L) detached, for logging only."""

    logprobs: Tensor
    entropy: Tensor


def token_logprobs(
    logits: Tensor, input_ids: Tensor, temperature: float = 1.0, row_lengths: Tensor | None = None
) -> TokenLogprobs:
    """Log-prob and entropy of each token given the logits of the positions before it.

    `logits` (B, K, V) may cover only the last K positions of the sequence (transformers'
    `logits_to_keep`), i.e. positions L-K .. L-1; tokens L-K+1 .. L-1 are scored and every other
    entry of the output is 0. With `row_lengths` (B,), the right padding of each row is not scored
    either (0).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    rows, length = input_ids.shape
    keep = logits.shape[1]
    if logits.shape[0] != rows or not 1 <= keep <= length:
        raise ValueError(f"logits {tuple(logits.shape)} do not cover input_ids {tuple(input_ids.shape)}")
    offset = length - keep  # sequence position of logits[:, 0]
    counts = None if row_lengths is None else (row_lengths - offset - 1).tolist()
    scored, entropy = score_targets(logits[:, :-1], input_ids[:, offset + 1 :], temperature, counts)
    lead = logits.new_zeros((rows, offset + 1), dtype=torch.float32)
    return TokenLogprobs(
        logprobs=torch.cat([lead, scored], dim=1),
        entropy=torch.cat([lead.detach(), entropy], dim=1),
    )


def score_targets(
    logits: Tensor, targets: Tensor, temperature: float, counts: Sequence[int] | None = None
) -> tuple[Tensor, Tensor]:
    """Log-prob (with grad) and entropy (detached) of `targets` (B, K) under `logits` (B, K, V), where
    `logits[:, k]` is the distribution that `targets[:, k]` was drawn from. With `counts`, only the
    first `counts[b]` targets of row b are scored and the rest are 0: they are padding, and over a
    large vocabulary scoring them costs as much as scoring a real token.

    Rows are processed one at a time so the float32 (K, V) temporaries are a row's, not the batch's.
    Every (K, V) temporary is a pass over memory that a small model's step is mostly made of: the
    logits are divided only when T is not 1 (the paper's and the default temperature), and each row is
    scored by `_ScoredRow`, whose entropy costs almost nothing.
    """
    scored: list[Tensor] = []
    entropies: list[Tensor] = []
    # unbind, not logits[row]: indexing inside the loop makes each row's backward materialise a
    # batch-sized gradient, so the cost grew with the square of the rows (2.0 s vs 0.73 s per group
    # of 8 x 128 tokens on the 135M model).
    width = logits.shape[1]
    for row, row_logits in enumerate(logits.unbind(0)):
        count = width if counts is None else max(0, min(width, counts[row]))
        tempered = row_logits.float() if temperature == 1.0 else row_logits.float() / temperature
        row_scored, row_entropy = _ScoredRow.apply(tempered, targets[row], count)  # type: ignore[no-untyped-call]
        scored.append(row_scored)
        entropies.append(row_entropy)
    return torch.stack(scored), torch.stack(entropies)


_CHUNK_BYTES = 1 << 20
"""About a core's L2 cache: the probabilities of one chunk of positions are read back from it."""


class _ScoredRow(torch.autograd.Function):
    """Log-prob of each target of one row's (K, V) float32 logits, and each position's entropy; both
    0 from position `count` on (padding, neither computed nor given a gradient).

    The entropy's probabilities are kept for the backward pass, which is then one pass over them:
    d log p_t / d x_v = [v == t] - p_v. Autograd's own backward of log_softmax and gather writes a
    dense gradient of the gather, reads it back and exponentiates the log-probs again. Each chunk of
    positions (`_CHUNK_BYTES`) is exponentiated and read back by the entropy's dot product while still
    in cache. 16 rows x 64 positions x 49k tokens, one thread, forward and backward (medians of 8):
    238 ms, against 326-370 ms for log_softmax and gather with the entropy computed beside them and
    212-221 ms for those two alone.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, count: int) -> tuple[Tensor, Tensor]:
        log_dist = torch.log_softmax(logits[:count], dim=-1)
        scored = logits.new_zeros(logits.shape[0])
        scored[:count] = log_dist.gather(-1, targets[:count].unsqueeze(-1)).squeeze(-1)
        entropy = torch.zeros_like(scored)
        probs = torch.empty_like(logits)
        step = max(1, _CHUNK_BYTES // (log_dist.element_size() * log_dist.shape[-1]))
        for start in range(0, count, step):
            end = min(start + step, count)
            part, out = log_dist[start:end], probs[start:end]
            torch.exp(part, out=out)
            entropy[start:end] = -torch.linalg.vecdot(out, part)
        ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(probs, targets)
        ctx.count, ctx.spent = count, False
        return scored, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_scored: Tensor, _grad_entropy: Tensor) -> tuple[Tensor, None, None]:
        # The gradient is written over the saved probabilities, so a graph kept for a second backward
        # pass (retain_graph) could not be backpropagated again through here.
        if ctx.spent:
            raise RuntimeError("score_targets' graph was backpropagated twice; it supports one pass")
        ctx.spent = True
        probs, targets = ctx.saved_tensors
        count = ctx.count
        grad, upstream = probs[:count], grad_scored[:count].unsqueeze(-1)
        grad.mul_(-upstream).scatter_add_(-1, targets[:count].unsqueeze(-1), upstream)
        probs[count:].zero_()
        return probs, None, None


def policy_logprobs(model: nn.Module, batch: PackedBatch, temperature: float = 1.0) -> TokenLogprobs:
    """Run a transformers causal LM on a packed batch and score its completion tokens.

    Passes the batch's explicit `position_ids` so positions equal those at sampling time, and asks
    only for the logits from the first position that predicts a completion token onwards
    (`logits_to_keep`): the prompt's logits are never needed, and the (B, L, V) logits tensor is the
    largest activation of a small model with a large vocabulary.
    """
    first_completion = int(batch.completion_mask.to(torch.int8).argmax(dim=1).min().item())
    keep = min(batch.seq_len, batch.seq_len - first_completion + 1)
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=keep,
        use_cache=False,
    )
    return token_logprobs(output.logits, batch.input_ids, temperature, batch.row_lengths)
