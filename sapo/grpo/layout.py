"""Training tensors laid out so every token sits at the position it had when it was sampled.

A generator sees `prompt + completion` as one contiguous sequence starting at position 0. The trainer
must score the same tokens at the same positions, or rotary embeddings see different offsets and the
"old" log-probs no longer describe the policy that sampled. So each row is `prompt ids + completion
ids` with padding only on the right (the public reference padded between prompt and completion,
which shifted every completion position), `position_ids` are 0..L-1, and the completion mask comes
from the known lengths, never from comparing ids with the pad id: when pad == EOS (common), a
pad-id mask would silently drop the EOS token, which must be trained so the model learns to stop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TrainSample:
    """One completion ready for training, in the trainer's own token ids.

    `completion_ids` are exactly the tokens the policy produced, including the final EOS when the
    model stopped by sampling it, or the stop string's last token when a stop string ended it (see
    `with_eos`). `behaviour_logprobs`, one per completion token,
    are the sampler's log-probs of those tokens; they only exist when the sampler used the same
    tokenizer (local groups, or external groups with a matching fingerprint).
    """

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    advantage: float
    behaviour_logprobs: Sequence[float] | None = None


@dataclass(frozen=True)
class PackedBatch:
    """Right-padded training rows. Shapes: B rows, L = longest prompt + completion in the batch.

    input_ids / attention_mask / position_ids: (B, L) int64, padding on the right only.
    completion_mask: (B, L) bool, True exactly on completion tokens (EOS included).
    advantages: (B,) float32, one per row.
    behaviour_logprobs: (B, L) float32 aligned with input_ids, 0 outside completion tokens and on
        rows without them.
    has_behaviour: (B,) bool, rows whose behaviour_logprobs are real.
    """

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    completion_mask: Tensor
    advantages: Tensor
    behaviour_logprobs: Tensor
    has_behaviour: Tensor

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def completion_tokens(self) -> int:
        """Number of trained tokens: the loss normalizer when this is the whole optimizer batch."""
        return int(self.completion_mask.sum().item())

    @property
    def row_lengths(self) -> Tensor:
        """(B,) real (unpadded) length of each row."""
        return self.attention_mask.sum(dim=1)

    def select(self, rows: Sequence[int]) -> PackedBatch:
        """The given rows, with trailing columns that are padding in all of them trimmed away.

        Trimming only the right edge is safe because padding is right-only: positions of real
        tokens do not change.
        """
        index = torch.as_tensor(list(rows), dtype=torch.long)
        if index.numel() == 0:
            raise ValueError("select needs at least one row")
        width = int(self.row_lengths[index].max().item())
        return PackedBatch(
            input_ids=self.input_ids[index, :width],
            attention_mask=self.attention_mask[index, :width],
            position_ids=self.position_ids[index, :width],
            completion_mask=self.completion_mask[index, :width],
            advantages=self.advantages[index],
            behaviour_logprobs=self.behaviour_logprobs[index, :width],
            has_behaviour=self.has_behaviour[index],
        )

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            advantages=self.advantages.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            has_behaviour=self.has_behaviour.to(device),
        )


def with_eos(completion_ids: Sequence[int], *, stopped: bool, eos_token_id: int) -> tuple[int, ...]:
    """Completion ids with the EOS token the policy emitted when it stopped.

    For text re-tokenized from another node (decoded text has no EOS), append our own EOS when the
    sender's model ended the completion with its EOS (`stopped`), so the stop decision is trained.
    A completion a stop string ended is not `stopped` in this sense: the sampler cut it after the stop
    string and no EOS was ever sampled (`sapo.trainer.sequences.ended_by_eos`). Idempotent: ids that
    already end in EOS (transformers and vLLM return the EOS they sampled) are left alone, and
    completions cut by the length limit get none because the model never chose to stop.
    """
    ids = tuple(completion_ids)
    if stopped and (not ids or ids[-1] != eos_token_id):
        return (*ids, eos_token_id)
    return ids


def _check_sample(i: int, sample: TrainSample) -> None:
    if len(sample.prompt_ids) == 0:
        raise ValueError(f"sample {i}: empty prompt; the first completion token needs a context")
    if len(sample.completion_ids) == 0:
        raise ValueError(f"sample {i}: empty completion; drop it before packing (nothing to train)")
    behaviour = sample.behaviour_logprobs
    if behaviour is not None and len(behaviour) != len(sample.completion_ids):
        raise ValueError(
            f"sample {i}: {len(behaviour)} behaviour logprobs for {len(sample.completion_ids)} "
            "completion tokens; they must be one per completion token"
        )


def pack(samples: Sequence[TrainSample], pad_token_id: int) -> PackedBatch:
    """Lay samples out as right-padded rows (see the module docstring for why)."""
    if not samples:
        raise ValueError("pack needs at least one sample")
    for i, sample in enumerate(samples):
        _check_sample(i, sample)
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    rows = len(samples)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    completion_mask = torch.zeros((rows, width), dtype=torch.bool)
    behaviour = torch.zeros((rows, width), dtype=torch.float32)
    has_behaviour = torch.zeros(rows, dtype=torch.bool)
    for i, sample in enumerate(samples):
        start = len(sample.prompt_ids)
        end = start + len(sample.completion_ids)
        input_ids[i, :end] = torch.as_tensor([*sample.prompt_ids, *sample.completion_ids])
        attention_mask[i, :end] = 1
        completion_mask[i, start:end] = True
        if sample.behaviour_logprobs is not None:
            behaviour[i, start:end] = torch.as_tensor(sample.behaviour_logprobs, dtype=torch.float32)
            has_behaviour[i] = True
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        # Padding positions keep counting; they are masked out and never scored.
        position_ids=torch.arange(width, dtype=torch.long).expand(rows, width).clone(),
        completion_mask=completion_mask,
        advantages=torch.as_tensor([s.advantage for s in samples], dtype=torch.float32),
        behaviour_logprobs=behaviour,
        has_behaviour=has_behaviour,
    )


def split_by_token_budget(batch: PackedBatch, max_tokens: int) -> list[PackedBatch]:
    """Micro-batches whose padded size (rows x longest row) stays within `max_tokens`.

    Activation memory scales with the padded size, so that is what the budget bounds. Rows are
    taken longest first so rows of similar length share a micro-batch and little is padding; the
    order does not matter to the loss, which is a sum normalized by the whole batch's token count.
    A row longer than the budget cannot be split and goes alone.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive; got {max_tokens}")
    lengths = batch.row_lengths.tolist()
    order = sorted(range(batch.num_rows), key=lambda r: (-lengths[r], r))
    groups: list[list[int]] = []
    for row in order:
        # Rows arrive longest first, so a group's first row sets its width.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(row)
        else:
            groups.append([row])
    return [batch.select(group) for group in groups]


def prompt_lengths(batch: PackedBatch) -> Tensor:
    """(B,) prompt length of each row: the column of its first completion token."""
    return batch.completion_mask.to(torch.int8).argmax(dim=1)


def prompt_groups(batch: PackedBatch) -> list[list[int]]:
    """Rows grouped by identical prompt ids, groups and rows in order of first appearance.

    Equal ids, not equal questions, decide: only rows whose prompt tokens are the same can share one
    computation of them (the completions of one group do, local or re-rendered by our template).
    """
    starts = prompt_lengths(batch).tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, start in enumerate(starts):
        groups.setdefault(tuple(batch.input_ids[row, :start].tolist()), []).append(row)
    return list(groups.values())


def shared_prompt_cost(prompt_lengths: Sequence[int], completion_lengths: Sequence[int]) -> int:
    """Padded tokens through the model when each distinct prompt runs once and every row's completion
    runs on top of its prompt's cache: distinct prompts x longest prompt + rows x longest completion."""
    return len(prompt_lengths) * max(prompt_lengths) + len(completion_lengths) * max(completion_lengths)


def split_by_shared_prompt_budget(batch: PackedBatch, max_tokens: int) -> list[PackedBatch]:
    """Micro-batches that keep each prompt's rows together, with `shared_prompt_cost` within `max_tokens`.

    Groups are taken longest completion first and rows within a group likewise, so little of the
    completion pass is padding. A group that does not fit a micro-batch of its own is cut into runs
    of rows that do (each run computes the prompt again); a single row over the budget goes alone.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive; got {max_tokens}")
    starts = prompt_lengths(batch).tolist()
    completions = (batch.row_lengths - prompt_lengths(batch)).tolist()
    groups = [sorted(g, key=lambda r: (-completions[r], r)) for g in prompt_groups(batch)]
    groups.sort(key=lambda g: -completions[g[0]])
    planned: list[list[list[int]]] = []  # micro-batches, each a list of prompt groups (lists of rows)

    def cost(part: list[list[int]]) -> int:
        return shared_prompt_cost([starts[g[0]] for g in part], [completions[r] for g in part for r in g])

    for group in groups:
        for run in _runs_within(group, lambda rows: cost([rows]) <= max_tokens):
            if planned and cost([*planned[-1], run]) <= max_tokens:
                planned[-1].append(run)
            else:
                planned.append([run])
    return [batch.select([r for run in part for r in run]) for part in planned]


def _runs_within(rows: list[int], fits: Callable[[list[int]], bool]) -> list[list[int]]:
    """`rows` cut, in order, into the fewest consecutive runs that each `fits` (a run of one always does)."""
    runs: list[list[int]] = []
    for row in rows:
        if runs and fits([*runs[-1], row]):
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs
