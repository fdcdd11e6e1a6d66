from __future__ import annotations

import pytest
import torch

from sapo.grpo.layout import (
    PackedBatch,
    TrainSample,
    pack,
    prompt_groups,
    shared_prompt_cost,
    split_by_shared_prompt_budget,
    split_by_token_budget,
    with_eos,
)

pytestmark = pytest.mark.unit

EOS = 9  # also the pad id below, as in many chat models


def _batch() -> list[TrainSample]:
    return [
        TrainSample(
            prompt_ids=[1, 2, 3], completion_ids=[4, EOS], advantage=1.0, behaviour_logprobs=[-0.5, -0.1]
        ),
        TrainSample(prompt_ids=[5], completion_ids=[6, 7, 8, EOS], advantage=-1.0),
        TrainSample(prompt_ids=[1, 2], completion_ids=[3], advantage=0.5),  # cut by the length limit
    ]


def test_rows_are_prompt_then_completion_then_right_padding() -> None:
    batch = pack(_batch(), pad_token_id=EOS)
    assert batch.input_ids.tolist() == [
        [1, 2, 3, 4, EOS],
        [5, 6, 7, 8, EOS],
        [1, 2, 3, EOS, EOS],
    ]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4]] * 3
    assert batch.advantages.tolist() == [1.0, -1.0, 0.5]


def test_completion_mask_covers_exactly_the_completion_including_eos_even_when_pad_is_eos() -> None:
    batch = pack(_batch(), pad_token_id=EOS)
    assert batch.completion_mask.tolist() == [
        [False, False, False, True, True],
        [False, True, True, True, True],
        [False, False, True, False, False],
    ]
    assert batch.completion_tokens == 2 + 4 + 1
    # The trained EOS tokens are the same id as the padding, which stays out of the mask.
    eos_trained = batch.completion_mask & (batch.input_ids == EOS)
    assert eos_trained.sum().item() == 2


def test_behaviour_logprobs_align_with_their_completion_tokens() -> None:
    batch = pack(_batch(), pad_token_id=EOS)
    assert batch.has_behaviour.tolist() == [True, False, False]
    assert batch.behaviour_logprobs[0].tolist() == pytest.approx([0, 0, 0, -0.5, -0.1])
    assert batch.behaviour_logprobs[1:].abs().sum().item() == 0


def test_with_eos_appends_only_when_stopped_and_missing() -> None:
    assert with_eos([4, 5], stopped=True, eos_token_id=EOS) == (4, 5, EOS)
    assert with_eos([4, EOS], stopped=True, eos_token_id=EOS) == (4, EOS)
    assert with_eos([4, 5], stopped=False, eos_token_id=EOS) == (4, 5)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (TrainSample(prompt_ids=[], completion_ids=[1], advantage=0.0), "empty prompt"),
        (TrainSample(prompt_ids=[1], completion_ids=[], advantage=0.0), "empty completion"),
        (
            TrainSample(prompt_ids=[1], completion_ids=[2, 3], advantage=0.0, behaviour_logprobs=[-1.0]),
            "one per",
        ),
    ],
)
def test_invalid_samples_are_rejected(sample: TrainSample, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack([sample], pad_token_id=0)


def test_split_respects_budget_and_keeps_every_row_once() -> None:
    lengths = [7, 2, 5, 3, 3, 6]
    samples = [
        TrainSample(prompt_ids=[1], completion_ids=list(range(2, n + 1)), advantage=float(i))
        for i, n in enumerate(lengths)
    ]
    batch = pack(samples, pad_token_id=0)
    micro = split_by_token_budget(batch, max_tokens=12)
    for part in micro:
        assert part.num_rows * part.seq_len <= 12
        assert part.seq_len == int(part.row_lengths.max())  # trailing padding trimmed
    assert sorted(a for part in micro for a in part.advantages.tolist()) == [0, 1, 2, 3, 4, 5]
    assert sum(part.completion_tokens for part in micro) == batch.completion_tokens


def test_split_keeps_an_overlong_row_alone() -> None:
    samples = [
        TrainSample(prompt_ids=[1, 2], completion_ids=[3, 4, 5, 6], advantage=1.0),
        TrainSample(prompt_ids=[1], completion_ids=[2], advantage=2.0),
    ]
    micro = split_by_token_budget(pack(samples, pad_token_id=0), max_tokens=4)
    assert [part.num_rows for part in micro] == [1, 1]
    assert micro[0].input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert micro[1].input_ids.tolist() == [[1, 2]]


def test_select_trims_only_trailing_padding() -> None:
    batch = pack(_batch(), pad_token_id=EOS)
    short = batch.select([2])
    assert short.input_ids.tolist() == [[1, 2, 3]]
    assert short.completion_mask.tolist() == [[False, False, True]]
    assert torch.equal(short.position_ids, torch.arange(3).unsqueeze(0))


def _groups(sizes: dict[tuple[int, ...], list[int]]) -> PackedBatch:
    """Rows of the given prompts with completions of the given lengths, prompts interleaved."""
    samples = [
        (i, TrainSample(prompt, list(range(20, 20 + n)), advantage=float(len(prompt) * 10 + i)))
        for prompt, lengths in sizes.items()
        for i, n in enumerate(lengths)
    ]
    samples.sort(key=lambda s: s[0])  # the first completion of every prompt, then the second, ...
    return pack([s for _, s in samples], pad_token_id=0)


def test_prompt_groups_are_rows_with_identical_prompt_ids() -> None:
    batch = _groups({(1, 2, 3): [2, 4], (1, 2): [3, 1], (4, 5, 6): [1]})
    assert prompt_groups(batch) == [[0, 3], [1, 4], [2]]


def test_shared_prompt_split_keeps_groups_together_within_the_budget() -> None:
    batch = _groups({(1, 2, 3): [2, 4, 4, 1], (5, 6, 7): [3, 3, 1, 2], (8, 9, 10): [5, 1, 1, 1]})
    micro = split_by_shared_prompt_budget(batch, max_tokens=20)  # one group: 3 + 4 x 5 = 23 at most
    for part in micro:
        groups = prompt_groups(part)
        starts = [int(part.completion_mask[g[0]].to(torch.int8).argmax()) for g in groups]
        completions = part.row_lengths - torch.as_tensor([starts[i] for i, g in enumerate(groups) for _ in g])
        assert shared_prompt_cost(starts, completions.tolist()) <= 20
        assert part.seq_len == int(part.row_lengths.max())
    prompts = [sorted(tuple(part.input_ids[r, :3].tolist()) for r in range(part.num_rows)) for part in micro]
    assert sum(part.num_rows for part in micro) == batch.num_rows
    assert sorted(a for part in micro for a in part.advantages.tolist()) == sorted(batch.advantages.tolist())
    # (5, 6, 7) costs 3 + 4 x 3 = 15 and (1, 2, 3) 3 + 4 x 4 = 19: each fits whole, not beside another.
    # (8, 9, 10) would cost 3 + 4 x 5 = 23: its rows longest first, 5 1 1 (18) and 1 (4).
    assert sorted(map(len, prompts)) == [1, 3, 4, 4]
    assert all(len(set(p)) == 1 for p in prompts)


def test_shared_prompt_split_puts_small_groups_together() -> None:
    batch = _groups({(1, 2): [2, 2], (3, 4): [1, 2], (5, 6): [2]})
    micro = split_by_shared_prompt_budget(batch, max_tokens=12)  # 2 x 2 + 4 x 2 = 12: two groups fit
    assert [part.num_rows for part in micro] == [4, 1]
    assert shared_prompt_cost([2, 2], [2, 2, 1, 2]) == 12


def test_shared_prompt_split_keeps_an_overlong_row_alone() -> None:
    batch = _groups({(1, 2, 3): [9, 1]})
    micro = split_by_shared_prompt_budget(batch, max_tokens=6)
    assert [part.num_rows for part in micro] == [1, 1]
    assert micro[0].row_lengths.tolist() == [12]
