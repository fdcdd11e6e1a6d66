"""Training rows from a `TrainingBatch`: token ids in our tokenizer, advantages, and where pi_old comes from.

Two ways to get a row's tokens:

- As sampled. A group produced with our tokenizer (equal `tokenizer_fingerprint`) carries the prompt ids
  exactly as fed to the model and the completion ids exactly as sampled, EOS / stop token included when
  generation stopped. Reusing them keeps every token at the position it was sampled at, and keeps the
  behaviour log-probs meaningful, since they are per token of exactly those ids.
- Re-tokenized. Text from another tokenizer (a peer's model, or an unknown fingerprint) is rebuilt in our
  own terms: the prompt is exactly what our own generator would have fed for the question
  (`render_prompt`, ending in the "<answer>" prefill, encoded by `sapo.tasks.encode_prompt`), the
  completion is our encoding of the decoded text without special tokens, plus our EOS when the sender's
  generation stopped (`with_eos`), so the stop decision is trained. Such rows have no behaviour
  log-probs.

Each row gets a `RowMode` saying which policy is pi_old (see `sapo.trainer.step`):

- BEHAVIOUR: local rows sampled from exactly the weights being trained (staleness 0). pi_old is the
  sampler's log-probs, so the first ratio measures the real sampler/trainer mismatch and clipping can act.
- CORRECTED: rows with behaviour log-probs from other weights: local rows with staleness > 0, and
  external rows in `external_logprobs="sender"` mode (same tokenizer, the peer's own policy). pi_old is
  the current policy; the truncated importance weight min(pi_old / pi_behaviour, cap) corrects for the
  sampler being a different policy.
- ON_POLICY: rows without behaviour log-probs (re-tokenized text, the paper's treatment of external
  groups). pi_old is the current policy and there is no importance weight.

Staleness is measured against the trainer's own version rather than the batch's target version: the two
agree in normal operation, and only the trainer knows for sure whether its weights are still the ones
the group was sampled from.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from transformers import PreTrainedTokenizerBase

from sapo.convert import question_from_proto
from sapo.grpo import TrainSample, with_eos
from sapo.models import tokenizer_fingerprint
from sapo.tasks import encode_prompt, render_prompt
from sapo.v1 import batch_pb2, rollout_pb2

log = logging.getLogger(__name__)

ExternalLogprobs = Literal["on_policy", "sender"]


class RowMode(enum.StrEnum):
    BEHAVIOUR = "behaviour"
    CORRECTED = "corrected"
    ON_POLICY = "on_policy"


@dataclass(frozen=True)
class Row:
    """One completion ready for packing, with what the step needs to know about it."""

    sample: TrainSample
    temperature: float
    mode: RowMode
    reward: float
    local: bool


@dataclass
class BuiltBatch:
    """The rows of one batch and what was left out of it (counted by reason)."""

    rows: list[Row] = field(default_factory=list)
    truncated: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    staleness: list[int] = field(default_factory=list)  # one per local group

    def reward_mean(self, *, local_only: bool = False) -> float:
        """Mean receiver reward over trained rows (all, or local only); NaN when there are none."""
        rewards = [r.reward for r in self.rows if r.local or not local_only]
        return math.fsum(rewards) / len(rewards) if rewards else math.nan


class SequenceBuilder:
    """Turns batch groups into `Row`s for one tokenizer; see the module docstring for the rules."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_sequence_tokens: int,
        external_logprobs: ExternalLogprobs = "on_policy",
    ) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer defines no EOS token; the stop decision could not be trained")
        if max_sequence_tokens < 2:
            raise ValueError(f"max_sequence_tokens must be >= 2; got {max_sequence_tokens}")
        self.tokenizer = tokenizer
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.max_sequence_tokens = max_sequence_tokens
        self.external_logprobs = external_logprobs

    def build(self, batch: batch_pb2.TrainingBatch, current_version: int) -> BuiltBatch:
        built = BuiltBatch()
        for bg in batch.groups:
            self._add_group(bg, current_version, built)
        return built

    def _add_group(self, bg: batch_pb2.BatchGroup, current_version: int, built: BuiltBatch) -> None:
        group = bg.group
        local = bg.source == batch_pb2.GROUP_SOURCE_LOCAL
        staleness = current_version - int(group.policy_version)
        if local:
            built.staleness.append(staleness)
        as_sampled = (
            group.tokenizer_fingerprint == self.fingerprint
            and len(group.prompt_token_ids) > 0
            and (local or self.external_logprobs == "sender")
        )
        temperature = float(group.sampling.temperature)
        if not temperature > 0:
            built.skipped["bad_temperature"] += len(group.completions)
            return
        prompt: Sequence[int] = tuple(group.prompt_token_ids)
        if not as_sampled:
            try:
                prompt = self._rendered_prompt(group)
            # The question came off the wire: one the task library cannot render is skipped, not fatal
            # (a poison batch would otherwise crash the trainer on every restart).
            except Exception:
                log.warning("cannot render the question of group %s; skipped", group.group_id, exc_info=True)
                built.skipped["bad_question"] += len(group.completions)
                return
        for i, completion in enumerate(group.completions):
            if completion.finish_reason == rollout_pb2.FINISH_REASON_ERROR:
                built.skipped["error"] += 1
                continue
            if as_sampled:
                ids = tuple(completion.token_ids)
                behaviour = tuple(completion.logprobs) or None
                if behaviour is not None and not _aligned(behaviour, ids):
                    built.skipped["bad_logprobs"] += 1
                    continue
                mode = _mode(behaviour, local=local, staleness=staleness)
            else:
                ids, behaviour, mode = self._retokenized(completion), None, RowMode.ON_POLICY
            self._add_row(
                built,
                prompt,
                ids,
                behaviour,
                advantage=float(bg.advantages[i]),
                reward=float(bg.rewards[i]),
                temperature=temperature,
                mode=mode,
                local=local,
            )

    def _add_row(
        self,
        built: BuiltBatch,
        prompt: Sequence[int],
        ids: Sequence[int],
        behaviour: Sequence[float] | None,
        *,
        advantage: float,
        reward: float,
        temperature: float,
        mode: RowMode,
        local: bool,
    ) -> None:
        room = self.max_sequence_tokens - len(prompt)
        if room < 1:
            built.skipped["prompt_too_long"] += 1
            return
        if not ids:
            built.skipped["empty"] += 1
            return
        if len(ids) > room:
            built.truncated += 1
            ids = ids[:room]
            behaviour = None if behaviour is None else behaviour[:room]
        sample = TrainSample(prompt, tuple(ids), advantage, behaviour)
        built.rows.append(Row(sample, temperature, mode, reward, local))

    def _retokenized(self, completion: rollout_pb2.Completion) -> tuple[int, ...]:
        """Our encoding of the decoded text, plus our EOS when the sender's generation stopped."""
        encoded = self.tokenizer.encode(completion.text, add_special_tokens=False)
        stopped = completion.finish_reason == rollout_pb2.FINISH_REASON_STOP
        return with_eos(encoded, stopped=stopped, eos_token_id=self.eos_token_id)

    def _rendered_prompt(self, group: rollout_pb2.RolloutGroup) -> tuple[int, ...]:
        return encode_prompt(
            self.tokenizer, render_prompt(self.tokenizer, question_from_proto(group.question))
        )


def _aligned(behaviour: Sequence[float], ids: Sequence[int]) -> bool:
    """One finite log-prob per token; anything else is a malformed completion."""
    return len(behaviour) == len(ids) and all(math.isfinite(x) for x in behaviour)


def _mode(behaviour: Sequence[float] | None, *, local: bool, staleness: int) -> RowMode:
    if behaviour is None:
        return RowMode.ON_POLICY
    return RowMode.BEHAVIOUR if local and staleness == 0 else RowMode.CORRECTED
