"""Our GRPO math against TRL 1.16's own code on identical inputs.

What is compared, and how:

- Loss, parameter gradients and metrics. A real `trl.GRPOTrainer` is built offline around a tiny
  Llama saved to a temporary directory and a local word-level tokenizer (`loss_type="dapo"`,
  epsilon 0.2, epsilon_high 0.28, temperature 0.7). We call its real `_compute_loss(model, inputs)`,
  which runs TRL's `_get_per_token_logps_and_entropies` and its fused, temperature-scaled LM head,
  the clipped objective, the "dapo" normalization by `num_items_in_batch`, and its metric logging.
  Our side runs `policy_logprobs` + `grpo_loss` on the `PackedBatch` of the same sequences with the
  same `old_per_token_logps`. Prompts share one length so TRL's prompt/completion split of our
  right-padded rows is exact. pi_old is TRL's own log-probs plus fixed offsets, so ratios leave the
  clip range on both sides (asserted). `bf16=False` (TRL's default is bf16 autocast) so both sides
  compute in float32. The model is in eval mode: TRL then divides by
  `num_items_in_batch` directly (in train mode it also multiplies by
  gradient_accumulation_steps / steps_per_generation, 1 / 1 here).
- KL: with beta = 0.04 TRL builds its own reference model (from the saved directory); we perturb
  its weights and score it with TRL's function for TRL's input and with ours for ours. TRL's default
  `use_bias_correction_kl=True` (k3 times the ratio) is what we implement.
- Importance correction: TRL applies it only with vLLM, computing the ratio inline in
  `_generate_and_score_completions`, which cannot run here. So we set the trainer's `use_vllm` and
  `vllm_importance_sampling_correction` flags (read by `_compute_loss` only to multiply by
  `inputs["importance_sampling_ratio"]`) and compute that ratio with TRL's "token_truncate" lines
  re-typed: clamp(exp(nan_to_num((old - sampling) * mask)), max=C). A row whose sampling
  log-probs are NaN (ratio 1 in TRL) is a row without behaviour log-probs on our side.
- Advantages: ours against (r - mean) / (trl.trainer.utils.nanstd(r) + 1e-4), TRL's group scaling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset  # type: ignore[import-untyped]
from torch import Tensor
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

from sapo.grpo.advantages import group_advantages
from sapo.grpo.config import LossConfig
from sapo.grpo.layout import PackedBatch, TrainSample, pack
from sapo.grpo.logprobs import policy_logprobs
from sapo.grpo.loss import grpo_loss
from tests.unit.grpo.tiny import EOS_ID, PAD_ID, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.unit

PROMPT_LEN = 3
TEMPERATURE = 0.7
IS_CAP = 2.0


def _zero_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)


def _trainer(tmp_path: Path, beta: float) -> GRPOTrainer:
    model_dir = tmp_path / "model"
    tiny_llama(seed=1).save_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=beta,
        temperature=TEMPERATURE,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=IS_CAP,
        max_completion_length=8,
        report_to="none",
        use_cpu=True,
        bf16=False,  # GRPOConfig defaults to bf16 autocast; compare the math in float32
        save_strategy="no",
    )
    dataset = Dataset.from_dict({"prompt": ["w1 w2 w3"] * 4})
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=_zero_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer(),
    )
    _model(trainer).train(False)
    return trainer


def _model(trainer: GRPOTrainer, *, ref: bool = False) -> torch.nn.Module:
    model = trainer.ref_model if ref else trainer.model
    assert isinstance(model, torch.nn.Module)
    return model


def _batch() -> PackedBatch:
    completions = [[4, 5, 6, EOS_ID], [7, EOS_ID], [8, 9, 10, 11, 12], [13]]
    advantages = [1.2, -0.7, 0.4, -1.5]
    samples = [
        TrainSample(prompt_ids=[1 + i, 2, 3], completion_ids=c, advantage=a)
        for i, (c, a) in enumerate(zip(completions, advantages, strict=True))
    ]
    return pack(samples, pad_token_id=PAD_ID)


def _trl_inputs(batch: PackedBatch) -> dict[str, Tensor]:
    return {
        "prompt_ids": batch.input_ids[:, :PROMPT_LEN],
        "prompt_mask": batch.attention_mask[:, :PROMPT_LEN],
        "completion_ids": batch.input_ids[:, PROMPT_LEN:],
        "completion_mask": batch.completion_mask[:, PROMPT_LEN:].long(),
        "advantages": batch.advantages,
        "num_items_in_batch": torch.tensor(batch.completion_tokens),
    }


def _trl_logps(trainer: GRPOTrainer, model: torch.nn.Module, batch: PackedBatch) -> Tensor:
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model, batch.input_ids, batch.attention_mask, batch.seq_len - PROMPT_LEN
        )
    assert isinstance(logps, Tensor)
    return logps


def _full(completion_values: Tensor, batch: PackedBatch) -> Tensor:
    """(B, C) completion-aligned values as our (B, L) input-aligned layout."""
    out = torch.zeros(batch.input_ids.shape)
    out[:, PROMPT_LEN:] = completion_values
    return out


def _grads(model: torch.nn.Module) -> list[Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return grads


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_gradients_and_metrics_match_trl(tmp_path: Path, beta: float) -> None:
    trainer = _trainer(tmp_path, beta)
    model = _model(trainer)
    batch = _batch()
    mask = batch.completion_mask[:, PROMPT_LEN:]
    noise = torch.Generator().manual_seed(0)
    current = _trl_logps(trainer, model, batch)
    # ratio = exp(-offset): rows 0 and 2 (A > 0) get tokens above 1.28, rows 1 and 3 (A < 0) below 0.8,
    # and each side also has tokens whose ratio is out of range on the side that is not clipped.
    offsets = torch.tensor(
        [
            [0.40, -0.40, 0.10, -0.10, 0.0],
            [0.40, -0.40, 0.0, 0.0, 0.0],
            [-0.30, 0.30, 0.05, -0.05, 0.20],
            [0.50, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    old = current + offsets
    inputs = _trl_inputs(batch) | {"old_per_token_logps": old}
    ours: dict[str, Any] = {"old_logprobs": _full(old, batch)}

    if beta > 0:
        with torch.no_grad():
            for parameter in _model(trainer, ref=True).parameters():
                parameter.add_(0.02 * torch.randn(parameter.shape, generator=noise))
        inputs["ref_per_token_logps"] = _trl_logps(trainer, _model(trainer, ref=True), batch)
        with torch.no_grad():
            ours["ref_logprobs"] = policy_logprobs(_model(trainer, ref=True), batch, TEMPERATURE).logprobs
        # Truncated importance correction, as TRL applies it to vLLM samples ("token_truncate").
        trainer.use_vllm = True
        trainer.vllm_importance_sampling_correction = True
        sampling = old + (torch.rand(old.shape, generator=noise) - 0.5) * 2.0
        sampling[1] = torch.nan  # no sampling log-probs for this row
        diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
        inputs["importance_sampling_ratio"] = torch.clamp(torch.exp(diff), max=IS_CAP)
        ours["behaviour_logprobs"] = _full(torch.nan_to_num(sampling, nan=0.0), batch)
        ours["has_behaviour"] = torch.tensor([True, False, True, True])

    trl_loss = trainer._compute_loss(model, inputs)  # type: ignore[no-untyped-call]
    assert isinstance(trl_loss, Tensor)
    torch.autograd.backward(trl_loss)
    trl_grads = _grads(model)

    scored = policy_logprobs(model, batch, TEMPERATURE)
    assert torch.allclose(scored.logprobs[:, PROMPT_LEN:][mask], current[mask], atol=1e-5)
    loss, metrics = grpo_loss(
        scored.logprobs,
        batch.advantages,
        batch.completion_mask,
        batch.completion_tokens,
        entropy=scored.entropy,
        config=LossConfig(eps_low=0.2, eps_high=0.28, beta=beta, is_cap=IS_CAP),
        **ours,
    )
    torch.autograd.backward(loss)

    assert trl_grads
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-7)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(_grads(model), trl_grads, strict=True))
    logged = trainer._metrics["eval"]
    assert metrics.clip_fraction_low > 0 and metrics.clip_fraction_high > 0
    assert metrics.clip_fraction_low == pytest.approx(logged["clip_ratio/low_mean"][-1])
    assert metrics.clip_fraction_high == pytest.approx(logged["clip_ratio/high_mean"][-1])
    assert metrics.entropy_mean == pytest.approx(logged["entropy"][-1], rel=1e-5)
    if beta > 0:
        assert metrics.kl_mean == pytest.approx(logged["kl"][-1], rel=1e-5)
        assert metrics.is_truncated_fraction > 0


@pytest.mark.parametrize("rewards", [[1.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.5, 0.1, 0.1, 0.0, 1.0, 0.3]])
def test_advantages_match_trl_group_scaling(rewards: list[float]) -> None:
    r = torch.tensor(rewards, dtype=torch.float64)
    expected = (r - r.mean()) / (nanstd(r) + 1e-4)
    # nanstd's Bessel factor count / (count - 1) is an int tensor division, rounded to float32.
    assert group_advantages(rewards) == pytest.approx(expected.tolist(), rel=1e-6)
