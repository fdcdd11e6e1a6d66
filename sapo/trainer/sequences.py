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
  model ended it with its EOS (`with_eos`), so the stop decision is trained. Such rows have no behaviour
  log-probs.

How a row ends, the same for both kinds. Every generator of the swarm samples with `STOP_STRINGS`
(`</answer>`) and cuts the completion right after the stop string, with no EOS: the sampler, not the
model, ends it there. A completion that ended on a stop string therefore ends with the stop string's
tokens, whether it is our own (as sampled) or a peer's (re-tokenized); only one the model ended by
sampling its EOS ends with an EOS. Appending our EOS after a stop string, as every stopped peer row once
got, would train a token our sampler never lets the model produce (and that evaluation never asks for),
and would make ~15% of external tokens that token, which local rows never have.

Temperature. Log-probs are taken at a temperature (`sapo.grpo.logprobs`). Local rows use the
temperature their group was sampled at, which their behaviour log-probs were recorded at. External rows
use the receiver's own sampling temperature (`sampling_temperature`, the trainer setting that must equal
the node's generator temperature): an on-policy row is scored as the receiver's policy would sample
it, and in "sender" mode the importance weight compares the receiver's sampling distribution with the
sender's tempered one. The sender's temperature describes only the sender's sampler.

Each row gets a `RowMode` saying which policy is pi_old (see `sapo.trainer.step`):

- BEHAVIOUR: local rows sampled from exactly the weights being trained (staleness 0). pi_old is the
  sampler's log-probs, so the first ratio measures the real sampler/trainer mismatch and clipping can act.
- CORRECTED: rows with behaviour log-probs from other weights: local rows with staleness > 0, local rows
  sampled from an approximation of the policy (`SamplingParams.quantization`, e.g. an int8 copy), and
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
from sapo.grpo.layout import TrainSample, with_eos
from sapo.models import tokenizer_fingerprint
from sapo.tasks import STOP_STRINGS, encode_prompt, render_prompt
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
    peer: str  # the node whose group this completion belongs to (the group's verified sender)
    group_id: str


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
        sampling_temperature: float = 1.0,
        stop_strings: Sequence[str] = STOP_STRINGS,
        vocab_size: int | None = None,
    ) -> None:
        """`vocab_size`: the rows of the model's input embedding (default: the tokenizer's length); a
        token id as sampled must lie below it."""
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer defines no EOS token; the stop decision could not be trained")
        if max_sequence_tokens < 2:
            raise ValueError(f"max_sequence_tokens must be >= 2; got {max_sequence_tokens}")
        if not sampling_temperature > 0:
            raise ValueError(f"sampling_temperature must be > 0; got {sampling_temperature}")
        self.tokenizer = tokenizer
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.max_sequence_tokens = max_sequence_tokens
        self.external_logprobs = external_logprobs
        self.sampling_temperature = sampling_temperature
        self.stop_strings = tuple(stop_strings)
        self.vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        self._warned_temperature = False

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
        sampled_at = float(group.sampling.temperature)
        if not sampled_at > 0:
            built.skipped["bad_temperature"] += len(group.completions)
            return
        if local:
            self._check_own_temperature(sampled_at)
        temperature = sampled_at if local else self.sampling_temperature
        prompt: Sequence[int] = tuple(group.prompt_token_ids)
        # Ids off the wire index the embedding: one past it would crash the step, and the restarts
        # with it, until the batch was quarantined.
        if as_sampled and not _in_vocab(prompt, self.vocab_size):
            log.warning("group %s: a prompt token id is outside the vocabulary; skipped", group.group_id)
            built.skipped["bad_token_id"] += len(group.completions)
            return
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
                if not _in_vocab(ids, self.vocab_size):
                    built.skipped["bad_token_id"] += 1
                    continue
                behaviour = tuple(completion.logprobs) or None
                if behaviour is not None and not _aligned(behaviour, ids):
                    built.skipped["bad_logprobs"] += 1
                    continue
                mode = _mode(
                    behaviour,
                    local=local,
                    staleness=staleness,
                    approximated=bool(group.sampling.quantization),
                )
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
                group=group,
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
        group: rollout_pb2.RolloutGroup,
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
        built.rows.append(Row(sample, temperature, mode, reward, local, group.node_id, group.group_id))

    def _retokenized(self, completion: rollout_pb2.Completion) -> tuple[int, ...]:
        """Our encoding of the decoded text, plus our EOS when the sender's model ended it with its EOS
        (not when a stop string ended it: see the module docstring)."""
        encoded = self.tokenizer.encode(completion.text, add_special_tokens=False)
        stopped = ended_by_eos(completion, self.stop_strings)
        return with_eos(encoded, stopped=stopped, eos_token_id=self.eos_token_id)

    def _check_own_temperature(self, sampled_at: float) -> None:
        """Our own groups show our generator's temperature: warn (once) when the setting disagrees."""
        if self._warned_temperature or math.isclose(sampled_at, self.sampling_temperature, rel_tol=1e-6):
            return
        self._warned_temperature = True
        log.warning(
            "local groups were sampled at temperature %g but external rows are scored at "
            "sampling_temperature %g: set SAPO_TRAINER_SAMPLING_TEMPERATURE to the generator's "
            "SAPO_GENERATOR_TEMPERATURE",
            sampled_at,
            self.sampling_temperature,
        )

    def _rendered_prompt(self, group: rollout_pb2.RolloutGroup) -> tuple[int, ...]:
        return encode_prompt(
            self.tokenizer, render_prompt(self.tokenizer, question_from_proto(group.question))
        )


def ended_by_eos(completion: rollout_pb2.Completion, stop_strings: Sequence[str]) -> bool:
    """Whether the model ended the completion by sampling its EOS: finish reason "stop" and the text
    does not end in a stop string (a sampler cut there, after the stop string, without an EOS)."""
    if completion.finish_reason != rollout_pb2.FINISH_REASON_STOP:
        return False
    return not any(completion.text.endswith(stop) for stop in stop_strings if stop)


def _in_vocab(ids: Sequence[int], vocab_size: int) -> bool:
    """Whether every id indexes the embedding (the wire's ids are unsigned)."""
    return not ids or max(ids) < vocab_size


def _aligned(behaviour: Sequence[float], ids: Sequence[int]) -> bool:
    """One finite log-prob per token; anything else is a malformed completion."""
    return len(behaviour) == len(ids) and all(math.isfinite(x) for x in behaviour)


def _mode(
    behaviour: Sequence[float] | None, *, local: bool, staleness: int, approximated: bool = False
) -> RowMode:
    if behaviour is None:
        return RowMode.ON_POLICY
    return RowMode.BEHAVIOUR if local and staleness == 0 and not approximated else RowMode.CORRECTED
