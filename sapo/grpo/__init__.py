"""Pure GRPO math: group advantages, position-exact training layout, token log-probs and the loss.

No Kafka and no services here: everything is a function of plain data and tensors, so it is tested
by hand-computed examples and against TRL 1.16's GRPOTrainer.
"""

from sapo.grpo.advantages import AdvantageScale, group_advantages, has_signal
from sapo.grpo.layout import (
    PackedBatch,
    TrainSample,
    pack,
    prompt_groups,
    split_by_shared_prompt_budget,
    split_by_token_budget,
    with_eos,
)
from sapo.grpo.logprobs import TokenLogprobs, policy_logprobs, token_logprobs
from sapo.grpo.loss import DEFAULT_LOSS_CONFIG, LossConfig, LossMetrics, combine_metrics, grpo_loss
from sapo.grpo.shared_prompt import shared_prompt_logprobs

__all__ = [
    "DEFAULT_LOSS_CONFIG",
    "AdvantageScale",
    "LossConfig",
    "LossMetrics",
    "PackedBatch",
    "TokenLogprobs",
    "TrainSample",
    "combine_metrics",
    "group_advantages",
    "grpo_loss",
    "has_signal",
    "pack",
    "policy_logprobs",
    "prompt_groups",
    "shared_prompt_logprobs",
    "split_by_shared_prompt_budget",
    "split_by_token_budget",
    "token_logprobs",
    "with_eos",
]
