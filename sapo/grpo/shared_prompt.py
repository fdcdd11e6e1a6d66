"""The log-probs of `policy_logprobs`, computing each distinct prompt of a micro-batch once.

The completions of a group share one prompt, often several times longer than they are. Scoring rows
as `prompt + completion` sends each prompt through the model (and back) once per completion; here it
goes once per distinct prompt, with `use_cache=True`, and every row's completion runs on top of a copy
of its prompt's key/value cache. The copy is an indexing of the cache tensors, so autograd carries the
gradient of every completion back into the one shared prompt computation: per-token log-probs, loss
and gradients are those of `policy_logprobs` up to float rounding.

Positions stay those of sampling (`sapo.grpo.layout`): prompts run right-padded at positions 0..P-1,
each completion token k at P + k. The completion pass sees the cached prompt keys (their padding
masked) followed by its own tokens; right padding means no query ever has all of its keys masked.
The first completion token is scored from the prompt pass's logits at its last real position, the
rest from the completion pass, whose last input column is dropped: its logits would predict a token
after the longest completion.

Gradient checkpointing cannot run with a cache (transformers turns `use_cache` off under it), so the
trainer uses `policy_logprobs` when checkpointing is on (`sapo.trainer.step.plan_micro_batches`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache

from sapo.grpo.layout import PackedBatch, prompt_groups, prompt_lengths
from sapo.grpo.logprobs import TokenLogprobs, score_targets


def shared_prompt_logprobs(model: nn.Module, batch: PackedBatch, temperature: float = 1.0) -> TokenLogprobs:
    """`policy_logprobs(model, batch, temperature)`, computed with one prompt pass per distinct prompt.

    Output layout is that of `policy_logprobs`: (B, L) aligned with `batch.input_ids`, values on
    completion tokens and 0 elsewhere.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    groups = prompt_groups(batch)
    starts = prompt_lengths(batch)
    lengths = batch.row_lengths - starts
    group_of_row = torch.empty(batch.num_rows, dtype=torch.long, device=starts.device)
    for g, rows in enumerate(groups):
        group_of_row[rows] = g
    first_logits, cache = _prompt_pass(model, batch, [rows[0] for rows in groups], starts)
    cache.batch_select_indices(group_of_row)
    inputs = int(lengths.max().item()) - 1
    # Both passes before any scoring, so a token id outside the vocabulary fails in the embedding
    # lookup, as in `policy_logprobs`, rather than in a gather.
    logits = (
        _completion_pass(model, batch, cache, starts=starts, lengths=lengths, inputs=inputs)
        if inputs > 0
        else None
    )
    first, first_entropy = score_targets(
        first_logits[group_of_row].unsqueeze(1), _completion_columns(batch.input_ids, starts, 1), temperature
    )
    scored, entropy = [first], [first_entropy]
    if logits is not None:
        targets = _completion_columns(batch.input_ids, starts + 1, inputs)
        rest, rest_entropy = score_targets(logits, targets, temperature, (lengths - 1).tolist())
        scored.append(rest)
        entropy.append(rest_entropy)
    return TokenLogprobs(
        logprobs=_place(torch.cat(scored, dim=1), starts, lengths, batch.seq_len),
        entropy=_place(torch.cat(entropy, dim=1), starts, lengths, batch.seq_len),
    )


def _prompt_pass(
    model: nn.Module, batch: PackedBatch, firsts: list[int], starts: Tensor
) -> tuple[Tensor, Cache]:
    """Each distinct prompt once (the rows `firsts` stand for them): (G, V) logits at its last
    position, and the key/value cache of all its positions."""
    prompt = starts[firsts]
    width = int(prompt.max().item())
    columns = torch.arange(width, device=prompt.device)
    output = model(
        input_ids=batch.input_ids[firsts, :width],
        attention_mask=(columns < prompt.unsqueeze(1)).long(),
        position_ids=batch.position_ids[firsts, :width],
        logits_to_keep=(prompt - 1).unsqueeze(1),
        use_cache=True,
    )
    if not isinstance(output.cache, Cache):
        raise TypeError(f"{type(model).__name__} returned no key/value cache; score it with policy_logprobs")
    return output.logits[:, 0], output.cache


def _completion_pass(
    model: nn.Module,
    batch: PackedBatch,
    cache: Cache,
    *,
    starts: Tensor,
    lengths: Tensor,
    inputs: int,
) -> Tensor:
    """(B, inputs, V) logits of completion tokens 0..inputs-1 of every row, on its prompt's cache;
    `logits[:, k]` predicts completion token k + 1."""
    columns = torch.arange(cache.get_seq_length(), device=starts.device)
    steps = torch.arange(inputs, device=starts.device)
    # The prompt columns mask each prompt's padding. Completion padding is already in every real
    # query's future; it is masked as in `policy_logprobs`, and so is each row's last token, which is
    # neither an input whose logits are needed nor a key for one.
    mask = torch.cat([columns < starts.unsqueeze(1), steps < (lengths - 1).unsqueeze(1)], dim=1)
    output = model(
        input_ids=_completion_columns(batch.input_ids, starts, inputs),
        attention_mask=mask.long(),
        position_ids=starts.unsqueeze(1) + steps,
        cache=cache,
        use_cache=True,
    )
    logits: Tensor = output.logits
    return logits


def _completion_columns(input_ids: Tensor, starts: Tensor, count: int) -> Tensor:
    """(B, count) ids from column `starts[r]` of each row on; columns past the right edge repeat the
    last one (they are padding, masked, and never scored)."""
    index = (starts.unsqueeze(1) + torch.arange(count, device=starts.device)).clamp(
        max=input_ids.shape[1] - 1
    )
    return input_ids.gather(1, index)


def _place(values: Tensor, starts: Tensor, lengths: Tensor, width: int) -> Tensor:
    """(B, C) values of completion tokens 0..C-1 written to columns starts..starts+C-1 of a (B, width)
    zero tensor, differentiably; values past a row's completion are dropped."""
    count = values.shape[1]
    steps = torch.arange(count, device=values.device)
    kept = torch.where(steps < lengths.unsqueeze(1), values, torch.zeros_like(values))
    # Positions past the row's end are padding: writing the zeros there is harmless, and widening by
    # `count` keeps every index in range before the trim.
    out = values.new_zeros((values.shape[0], width + count))
    return out.scatter(1, starts.unsqueeze(1) + steps, kept)[:, :width]
