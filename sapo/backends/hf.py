"""Sampling with Hugging Face transformers (the CPU path): B prompts x L completions in one ``generate``.

How a batch is laid out and read back:

- Prompts are left-padded to a common width, so every row's next token comes from the last column.
  ``generate`` derives position ids from the attention mask, so each completion token is
  produced at the same position it would have in the unpadded prompt; the trainer re-lays sequences
  out without padding and gets the same logits.
- The batch has B*L rows; row ``r`` belongs to prompt ``r // L``. Each prompt is read once: a forward
  pass over each prompt alone (all but its last token, unpadded) fills a KV cache that is stacked
  right-aligned and repeated for the L rows of each prompt, and ``generate`` continues from it (the
  prompt's last token, then the completion). With short completions the prompt pass is most of a
  batch's work, and ``generate``'s own ``num_return_sequences`` would read every prompt L times,
  padded to the longest (`share_prompt=False` does, as the reference this is tested against); see
  `bench/bench_cpu_generation.py` for what each step bought. Int8-dynamic rollouts share it too, but
  their samples were never independent of the batch (activation scales are computed per call).
- The stacked cache keeps room for the completion (`ReservedLayer`), so a decode step writes its
  position in place instead of copying every row's cache (transformers' `DynamicLayer` concatenates).
- Seeded batches with a shared prompt cache (every generator batch) are decoded by `_decode`, a loop
  that calls the model on the inputs ``generate`` would pass and takes each token straight from
  `_RowSampler.choose`; other batches go through ``generate``, with the logits processor and stopping
  criterion below.
- Behaviour logprobs: the logits processor sees the raw logits of each step (ahead of any
  temperature / top-k / top-p warping) and keeps what gives ``log_softmax(logits / T)`` of a token
  (``_RowSampler`` for seeded batches, which draws as well; ``_TemperedLogits``, ahead of
  ``generate``'s own warpers, for unseeded ones); a stopping criterion,
  which ``generate`` calls right after the sampled token is appended, gathers the chosen token's
  ``log_softmax(logits / T)``. Only one step of full-vocabulary logits is alive at a time (storing them
  all with ``output_logits`` would hold B*L*T*V floats: ~0.8 GB for 8x8 prompts and 64 tokens).
  See :mod:`sapo.backends.base` for why truncation is not reflected in the logprob.
- The same criterion records, per row, the step at which it first produced an EOS token or completed a
  stop string (matched on the generated tokens only, never across the prompt boundary). The completion
  is cut right after that token; everything ``generate`` appended later (padding) is dropped. Rows that
  never stopped end with ``finish_reason="length"``.
- The backend replaces the model's ``generation_config`` by one holding only the special token ids, so
  sampling defaults shipped with a checkpoint (repetition penalty, min-p, top-k 50, ...) can never
  change the distribution behind the recorded logprobs.
- Quantized rollouts (``quantization="int8-dynamic"``, CPU only): sampling runs on a copy of the policy
  whose linear layers hold int8 weights with per-call activation scales (torch's dynamic quantization;
  the model's own weights stay fp32 and are what ``load_weights`` updates, re-quantizing the copy).
  2.6-3.7x faster sampling for the 135M model on a 2-core CPU, but the copy is a different policy: its
  log-probs are ~0.85 nats per sampled token from the fp32 policy's (`bench/bench_cpu_generation.py`).
  The group says it sampled from an approximation (``SamplingParams.quantization``) so that the
  trainer importance-weights those rows; off by default.
- Seeded batches draw every row from its own generator (``_RowSampler``, seeded with
  ``sample_seed(seed of its prompt, sample index)``), not from torch's global one, so a prompt's
  completions do not depend on which other prompts share the call: a work item sampled again in
  another batch gets the same tokens (up to floating-point differences of the batched forward pass).
  The sampler applies temperature, top-k and top-p itself and hands ``generate`` a one-hot choice.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Final, cast

import torch
from safetensors.torch import load_file
from transformers import (
    Cache,
    DynamicLayer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from sapo.backends.base import Sample, SamplingConfig, WeightsSource, prompt_seeds, sample_seed, weight_files
from sapo.models.loading import load_model

log = logging.getLogger(__name__)
INT8_DYNAMIC: Final = "int8-dynamic"
QUANTIZATIONS: Final = ("", INT8_DYNAMIC)
"""Ways the sampling weights may approximate the policy ("" = not at all)."""


def quantize_int8_dynamic(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of ``model`` whose ``nn.Linear`` layers compute in int8 (weights quantized per tensor once,
    activations per call); ``model`` is left as it is.

    torch marks ``torch.ao.quantization`` deprecated in favour of torchao, but torchao's int8 configs
    were no faster than fp32 on CPU without ``torch.compile`` (bench_cpu_generation's notes), while this
    path is several times faster; the torch version is pinned, and a build without it fails at start.
    """
    quantize_dynamic = getattr(getattr(torch, "ao", None), "quantization", None)
    if quantize_dynamic is None or not hasattr(quantize_dynamic, "quantize_dynamic"):
        raise RuntimeError(
            f"this torch build ({torch.__version__}) has no torch.ao.quantization.quantize_dynamic"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = quantize_dynamic.quantize_dynamic(
            model, {torch.nn.Linear}, dtype=torch.qint8, inplace=False
        )
    return cast(PreTrainedModel, quantized)


class _TemperedLogits(LogitsProcessor):
    """Keeps the current step's ``logits / T`` and log-normaliser; leaves the scores untouched (the
    behaviour log-probs of an unseeded batch, which ``generate`` draws itself)."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.tempered: torch.Tensor | None = None
        self.log_norm: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.tempered = scores / self.temperature
        self.log_norm = torch.logsumexp(self.tempered, dim=-1)
        return scores

    def logprob_of(self, chosen: torch.Tensor) -> torch.Tensor:
        """``log_softmax(logits / T)`` of the chosen token in each row."""
        if self.tempered is None or self.log_norm is None:
            raise RuntimeError("no logits recorded for this step")
        return self.tempered.gather(1, chosen[:, None]).squeeze(1) - self.log_norm


LOG2_E: Final = 1.4426950408889634
DRAW_BLOCK: Final = 1024
"""Tokens per block of `draw_index`'s first level (49k-token vocabularies: 48 blocks)."""


def draw_index(weights: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling of each row of non-negative, unnormalised `weights` (rows, vocab): the
    first index whose cumulative weight reaches ``draws[row]`` (uniform in [0, 1)) times the row's
    total, as `torch.searchsorted` over the row's cumulative sum finds it; and the totals.

    Two-level, so that no pass cumulates the whole vocabulary: the sums of blocks of `DRAW_BLOCK`
    tokens (a vectorised reduction) are cumulated to find each row's block, and only that block's
    weights are gathered and cumulated to find the token. Raises RuntimeError, as `torch.multinomial`
    would, when a total is not finite (diverged weights)."""
    rows, vocab = weights.shape
    whole = vocab - vocab % DRAW_BLOCK
    sums = [weights[:, :whole].reshape(rows, -1, DRAW_BLOCK).sum(dim=-1)] if whole else []
    if whole < vocab:
        sums.append(weights[:, whole:].sum(dim=-1, keepdim=True))
    block_cdf = torch.cat(sums, dim=1).cumsum_(dim=1)
    totals = block_cdf[:, -1]
    if not bool(torch.isfinite(totals).all()):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0")
    target = (draws * totals)[:, None]
    block = torch.searchsorted(block_cdf, target).clamp_max_(block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp_min(0)), 0.0)
    first = block * DRAW_BLOCK
    columns = first + torch.arange(DRAW_BLOCK, device=weights.device)
    inside = columns < vocab
    part = weights.gather(1, columns.clamp_max(vocab - 1)).masked_fill_(~inside, 0.0).cumsum_(dim=1)
    # A target past the block's cumulative total (rounding) takes the block's last token in the vocabulary.
    offset = torch.minimum(torch.searchsorted(part, target - before), vocab - 1 - first)
    return first + offset.clamp_max_(DRAW_BLOCK - 1), totals


class _RowSampler(LogitsProcessor):
    """Samples each row from its own seeded generator and returns the choice as one-hot scores (0 for
    the chosen token, -inf elsewhere), so ``generate``'s own pick can only take it. Tempering and the
    top-k / top-p cut-offs happen here, in the order ``generate`` would apply them. Also the seeded
    batch's source of behaviour log-probs (``log_softmax(logits / T)``, before any cut-off).

    Without cut-offs (the default sampling) one buffer serves the draw and the log-normaliser, and
    then holds the one-hot result: ``exp((logits - max) / T)``, computed as ``2 ** ((logits - max) *
    log2(e) / T)`` in one fused shift-and-scale pass and torch's exp2 kernel (about half of
    ``torch.exp``'s time on an AVX2 CPU). The draw is two-level (`draw_index`): sums of blocks of
    `DRAW_BLOCK` tokens, cumulated, pick a row's block, and only that block is cumulated to pick the
    token; a cumulative sum over the whole vocabulary was the slowest pass of the step. 64 rows x 49k
    tokens on one thread: tempering, log-sum-exp, softmax, cumulative sum and a fresh one-hot tensor
    took ~44 ms a step; one buffer with `exp_` and a whole-row cumulative sum ~20 ms (14.7 ms on a
    later day, when this took 10.0: `bench/bench_draw.py`)."""

    def __init__(self, seeds: Sequence[int], params: SamplingConfig) -> None:
        self._generators = [torch.Generator().manual_seed(s) for s in seeds]
        self._warpers: list[LogitsProcessor] = []
        if params.top_k > 0:
            self._warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            self._warpers.append(TopPLogitsWarper(params.top_p))
        self._temperature = params.temperature
        # This step's logits, and what `logprob_of` subtracts: (logit - shift) / T - log_norm.
        self._scores: torch.Tensor | None = None
        self._shift: torch.Tensor | float = 0.0
        self._log_norm: torch.Tensor | None = None
        # One (rows, vocabulary) buffer for every step: a fresh one each step cost ~45 ms more of a
        # ~600 ms warm:0 call of 8 x 8 (profiled), most likely its pages faulted in again each time.
        self._buffer: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """As a logits processor of ``generate``: the choice as one-hot scores."""
        chosen, buffer = self._draw(input_ids, scores)
        one_hot = buffer if buffer.dtype == scores.dtype else torch.empty_like(scores)
        one_hot.fill_(float("-inf")).scatter_(1, chosen, 0.0)
        return one_hot  # type: ignore[return-value]

    def choose(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The token drawn for each row (`_decode`, which needs no one-hot scores to take it from)."""
        return self._draw(input_ids, scores)[0].squeeze(1)

    def _draw(self, input_ids: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, 1) chosen tokens, and the (rows, vocabulary) buffer they were drawn from (free to
        overwrite until the next step); keeps what `logprob_of` needs."""
        logits, temperature = scores.float(), self._temperature
        draws = torch.cat([torch.rand(1, generator=g) for g in self._generators]).to(logits.device)
        if self._warpers:
            tempered = logits / temperature
            # Before the warpers: the behaviour log-probs are of the untruncated distribution (and
            # transformers' warpers return new tensors, so `tempered` stays as it is).
            self._shift, self._log_norm = 0.0, torch.logsumexp(tempered, dim=-1)
            for warper in self._warpers:
                tempered = warper(cast(torch.LongTensor, input_ids), cast(torch.FloatTensor, tempered))
            weights = torch.softmax(tempered, dim=-1)
            chosen, _ = draw_index(weights, draws)
        else:
            peak = logits.amax(dim=-1, keepdim=True)
            scale = LOG2_E / temperature
            if self._buffer is None or self._buffer.shape != logits.shape:
                self._buffer = torch.empty_like(logits)
            weights = torch.add(peak * -scale, logits, alpha=scale, out=self._buffer).exp2_()
            chosen, totals = draw_index(weights, draws)
            self._shift, self._log_norm = peak, totals.log()
        self._scores = logits
        return chosen, weights

    def logprob_of(self, chosen: torch.Tensor) -> torch.Tensor:
        """``log_softmax(logits / T)`` of the chosen token in each row."""
        if self._scores is None or self._log_norm is None:
            raise RuntimeError("no logits recorded for this step")
        picked = self._scores.gather(1, chosen[:, None])
        return ((picked - self._shift) / self._temperature).squeeze(1) - self._log_norm


class _CompletionTracker(StoppingCriteria):
    """Gathers each sampled token's logprob and records where each row first stopped."""

    def __init__(
        self,
        logits: _TemperedLogits | _RowSampler,
        prompt_width: int,
        eos_ids: torch.Tensor,
        stop_strings: StopStringCriteria | None,
        rows: int,
    ) -> None:
        self.logits = logits
        self.prompt_width = prompt_width
        self.eos_ids = eos_ids
        self.stop_strings = stop_strings
        self.step_logprobs: list[torch.Tensor] = []
        # Completion length (stop token included) of rows that stopped; 0 while a row is running.
        self.ends = torch.zeros(rows, dtype=torch.long, device=eos_ids.device)

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object
    ) -> torch.BoolTensor:
        chosen = input_ids[:, -1]
        self.step_logprobs.append(self.logits.logprob_of(chosen).float())
        done = torch.isin(chosen, self.eos_ids)
        if self.stop_strings is not None:
            done = done | self.stop_strings(input_ids[:, self.prompt_width :], scores)
        self.ends[done & (self.ends == 0)] = input_ids.shape[1] - self.prompt_width
        return done  # type: ignore[return-value]


def _decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    cache: Cache,
    *,
    sampler: _RowSampler,
    tracker: _CompletionTracker,
    max_new_tokens: int,
) -> torch.Tensor:
    """The rows' tokens, prompt and completion, sampled from `cache` (every prompt token but the last):
    what ``generate`` returns for a seeded batch whose prompt cache is shared, with the model called
    on the same inputs (the last token, the position after the row's previous one, the mask grown by
    a column) and `tracker` deciding which rows finished. A finished row samples on until all have
    (``generate`` would feed it padding instead): rows are independent, and what follows a row's end
    is cut off (`TransformersBackend._unpack`).
    The token comes from `_RowSampler.choose`: ``generate`` would copy each step's (rows,
    vocabulary) logits, have the choice written into one-hot scores of that size, and take their
    maximum, three passes over the largest tensor of a small model's step (~11 ms of ~55 for 64 rows
    of the 49k vocabulary)."""
    rows = input_ids.shape[0]
    tokens, token = input_ids, input_ids[:, -1:]
    positions = mask.sum(dim=-1, keepdim=True) - 1
    running = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(
                input_ids=token,
                cache=cache,
                position_ids=positions,
                attention_mask=mask,
                logits_to_keep=1,
                use_cache=True,
            )
            scores = out.logits[:, -1]
            chosen = sampler.choose(tokens, scores)
            tokens = torch.cat([tokens, chosen[:, None]], dim=-1)
            running &= ~tracker(cast(torch.LongTensor, tokens), cast(torch.FloatTensor, scores))
            if not bool(running.any()):
                break
            token, positions = chosen[:, None], positions + 1
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
    return tokens


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` with every prompt right-aligned."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), mask.to(device)


def _prompt_cache(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    copies: int,
    room: int | None,
) -> Cache:
    """The KV cache of the left-padded prompts up to their last token, each prompt's entries repeated
    for its `copies` rows: the cache ``generate`` would have built for every row, computed once per
    prompt. Each prompt is read unpadded where the model's cache layers allow it (padding to the
    longest prompt doubled the work for the generator's 86-354-token prompts), into layers with `room`
    positions reserved for the completion (`ReservedLayer`); positions are those ``generate`` derives
    from the mask either way. Only the last position's logits are computed, as the 49k-row output
    layer over every prompt token cost a fifth of the pass and is thrown away."""
    with torch.no_grad():
        cache = _unpadded_cache(model, prompts, input_ids.shape[1] - 1, copies, room)
        if cache is None:
            head, head_mask = input_ids[:, :-1], mask[:, :-1]
            positions = (head_mask.cumsum(-1) - 1).masked_fill(head_mask == 0, 0)
            out = model(
                input_ids=head,
                attention_mask=head_mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.cache
            cache.batch_repeat_interleave(copies)
    return cache


def _unpadded_cache(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], width: int, copies: int, room: int | None
) -> Cache | None:
    """Each prompt but its last token through the model alone, the caches stacked right-aligned to
    `width` (zeros where the mask hides padding) and repeated for `copies` rows, with `room` positions
    to grow; None when a cache layer is not a plain growing one (sliding-window layers keep a window,
    not the whole prompt), so the caller pads instead."""
    stacked: Cache | None = None
    per_prompt: list[list[DynamicLayer] | None] = []
    for prompt in prompts:
        if len(prompt) == 1:  # nothing before its last token: all padding
            per_prompt.append(None)
            continue
        head = torch.tensor([list(prompt[:-1])], device=model.device)
        cache: Cache = model(input_ids=head, use_cache=True, logits_to_keep=1).cache
        layers = [layer for layer in cache.layers if type(layer) is DynamicLayer]
        if len(layers) != len(cache.layers):
            return None
        per_prompt.append(layers)
        if stacked is None:
            stacked = cache
    if stacked is None:
        return None
    reserved = [
        ReservedLayer.stacked([None if p is None else p[index] for p in per_prompt], width, copies, room or 0)
        for index in range(len(stacked.layers))
    ]
    stacked.layers = [layer if room is not None else layer.as_dynamic() for layer in reserved]
    return stacked


class ReservedLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A `DynamicLayer` whose keys and values are views of buffers with room for more positions: each
    decode step writes its position in place, where `DynamicLayer.update` concatenated a new copy of
    the whole cache (B x L rows of the prompt width) every step. With the 135M model's 86-387-token
    prompts at 8 x 8 rows those copies took as long as the linear layers (a third of the batch's time
    went to them); the tokens and log-probs are the same. When a method inherited from `DynamicLayer`
    replaces the keys or values (beam reordering, cropping) or the room runs out, the next update
    reserves new buffers from what the layer holds then."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._key_buffer, self._value_buffer = keys, values
        self._expose(length)
        self.device, self.is_initialized = keys.device, True

    @classmethod
    def stacked(
        cls, parts: Sequence[DynamicLayer | None], width: int, copies: int, room: int
    ) -> ReservedLayer:
        """One row per part (None: all padding), right-aligned to `width`, each repeated `copies`
        times in place (row ``i * copies + j``, as ``repeat_interleave`` lays them out)."""
        template = next(part for part in parts if part is not None)
        buffers = []
        for name in ("keys", "values"):
            like: torch.Tensor = getattr(template, name)
            heads, dim = like.shape[1], like.shape[3]
            buffer = like.new_zeros((len(parts), copies, heads, width + room, dim))
            for row, part in enumerate(parts):
                if part is not None:
                    states: torch.Tensor = getattr(part, name)
                    buffer[row, :, :, width - states.shape[2] : width] = states
            buffers.append(buffer.view(len(parts) * copies, heads, width + room, dim))
        return cls(buffers[0], buffers[1], width)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys, self.values
        if not self.is_initialized or keys is None or values is None:
            # Reset since: grow as DynamicLayer does; the next update reserves.
            return super().update(key_states, value_states)
        start = keys.shape[-2]
        stop = start + key_states.shape[-2]
        if keys is not self._exposed[0] or values is not self._exposed[1]:
            self._reserve(keys, values, room=stop - start)
        elif stop > self._key_buffer.shape[-2]:
            self._reserve(keys, values, room=max(stop - start, start))
        self._key_buffer[:, :, start:stop] = key_states
        self._value_buffer[:, :, start:stop] = value_states
        return self._expose(stop)

    def as_dynamic(self) -> DynamicLayer:
        """A plain `DynamicLayer` holding a copy of what this one holds."""
        layer = DynamicLayer()  # type: ignore[no-untyped-call]
        layer.update(*(held.contiguous() for held in self._exposed))
        return layer

    def _expose(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._exposed = (self._key_buffer[:, :, :length], self._value_buffer[:, :, :length])
        self.keys, self.values = self._exposed
        return self._exposed

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        length = keys.shape[-2]
        for name, held in (("_key_buffer", keys), ("_value_buffer", values)):
            batch, heads, _, dim = held.shape
            buffer = held.new_empty((batch, heads, length + room, dim))
            buffer[:, :, :length] = held
            setattr(self, name, buffer)


def _read_weights(weights: WeightsSource) -> Mapping[str, torch.Tensor]:
    """A state dict from memory, a ``.safetensors`` file, or every ``*.safetensors`` in a directory."""
    if isinstance(weights, Mapping):
        return weights
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(Path(weights)):
        state.update(load_file(str(file)))
    return state


def _check_keys(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Reject a state dict that does not cover the model exactly (tied copies may be omitted)."""
    named = dict(model.named_parameters(remove_duplicate=False))
    expected = set(model.state_dict())
    unexpected = sorted(set(state) - expected)
    covered = {id(named[k]) for k in state if k in named}
    missing = sorted(k for k in expected - set(state) if k not in named or id(named[k]) not in covered)
    if unexpected or missing:
        raise ValueError(
            f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def _adopt(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make the tensors that fit exactly the model's own (tied parameters are one object, so both
    names follow); return the rest, to be copied."""
    targets: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    targets |= dict(model.named_buffers(remove_duplicate=False))
    rest: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        target = targets[name]
        if (target.dtype, target.device, target.shape) == (tensor.dtype, tensor.device, tensor.shape):
            target.data = tensor.detach()
        else:
            rest[name] = tensor
    return rest


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-sequence ids: the checkpoint's generation config plus the tokenizer's EOS token."""
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model nor the tokenizer defines an EOS token")
    return sorted(ids)


class TransformersBackend:
    """:class:`~sapo.backends.base.GenerationBackend` over a transformers causal LM.

    The backend owns ``model``: it puts it in eval mode and replaces its ``generation_config``.
    ``eos_token_ids`` overrides the end-of-sequence ids (default: generation config + tokenizer EOS).
    ``share_prompt=False`` reads each prompt once per completion, ``reserve_cache=False`` lets the
    shared prompt cache grow by concatenation and ``own_decode=False`` has ``generate`` pick a seeded
    batch's tokens from one-hot scores instead of `_decode`: all three only for comparisons (tests,
    benches).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        eos_token_ids: Sequence[int] | None = None,
        model_version: int = 0,
        quantization: str = "",
        share_prompt: bool = True,
        reserve_cache: bool = True,
        own_decode: bool = True,
    ) -> None:
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        if quantization and model.device.type != "cpu":
            raise ValueError(
                f"quantization {quantization!r} runs on CPU only; the model is on {model.device}"
            )
        model.eval()  # type: ignore[no-untyped-call]
        self._model = model
        self._tokenizer = tokenizer
        self._eos_ids = list(eos_token_ids) if eos_token_ids is not None else _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self._pad_id: int = pad if pad is not None else self._eos_ids[0]
        self._model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
            bos_token_id=tokenizer.bos_token_id, eos_token_id=self._eos_ids, pad_token_id=self._pad_id
        )
        self._version = model_version
        self._stop_criteria: dict[tuple[str, ...], StopStringCriteria] = {}
        self._quantization = quantization
        self._share_prompt = share_prompt
        self._reserve_cache = reserve_cache
        self._own_decode = own_decode
        self._sampling_model = self._approximated()

    def _approximated(self) -> PreTrainedModel:
        """The model generation runs on: the policy itself, or its quantized copy."""
        return quantize_int8_dynamic(self._model) if self._quantization else self._model

    @classmethod
    def from_model_ref(
        cls,
        model_ref: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        quantization: str = "",
    ) -> TransformersBackend:
        """Load a model reference (see :func:`sapo.models.load_model` for the dtype trade-off)."""
        model, tokenizer = load_model(model_ref, dtype=dtype, device=device)
        return cls(model, tokenizer, quantization=quantization)

    @property
    def quantization(self) -> str:
        """How the sampling weights approximate the policy ("" = they are the policy's)."""
        return self._quantization

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def model(self) -> PreTrainedModel:
        """The policy's model (shared, not a copy; with quantization, the full-precision original)."""
        return self._model

    @property
    def model_version(self) -> int:
        return self._version

    def load_weights(self, weights: WeightsSource, version: int, *, owned: bool = False) -> None:
        """Swap new weights into the model, checking keys first. Owned tensors with a parameter's dtype,
        device and shape become its data (no copy: a 135M policy swaps in the time of its digest);
        the others are copied in place (dtype converted)."""
        state = _read_weights(weights)
        _check_keys(self._model, state)
        rest = _adopt(self._model, state) if owned else state
        self._model.load_state_dict(rest, strict=False)
        if self._quantization:
            self._sampling_model = self._approximated()
        self._version = version

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingConfig,
        seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.quantization != self._quantization:
            raise ValueError(
                f"asked to sample with quantization {params.quantization!r}; this backend samples with"
                f" {self._quantization!r}"
            )
        device = self._model.device
        input_ids, mask = left_pad(prompts, self._pad_id, device)
        rows = len(prompts) * params.num_samples
        per_prompt = prompt_seeds(params, len(prompts), seeds)
        logits: _TemperedLogits | _RowSampler
        if per_prompt is not None:
            row_seeds = [sample_seed(s, j) for s in per_prompt for j in range(params.num_samples)]
            logits = _RowSampler(row_seeds, params)
        else:
            logits = _TemperedLogits(params.temperature)
        tracker = _CompletionTracker(
            logits,
            input_ids.shape[1],
            torch.tensor(self._eos_ids, device=device),
            self._stop_for(params),
            rows,
        )
        try:
            # Seeded, generate still draws from torch's global RNG (a forced choice): keep its state.
            rng = torch.random.fork_rng(devices=_cuda_devices(device)) if per_prompt else nullcontext()
            copies = params.num_samples
            shared = self._share_prompt and input_ids.shape[1] > 1
            cache = (
                _prompt_cache(
                    self._sampling_model,
                    prompts,
                    input_ids,
                    mask,
                    copies=copies,
                    room=params.max_new_tokens if self._reserve_cache else None,
                )
                if shared
                else None
            )
            with rng:
                if self._own_decode and cache is not None and isinstance(logits, _RowSampler):
                    sequences = _decode(
                        self._sampling_model,
                        input_ids.repeat_interleave(copies, 0),
                        mask.repeat_interleave(copies, 0),
                        cache,
                        sampler=logits,
                        tracker=tracker,
                        max_new_tokens=params.max_new_tokens,
                    )
                    return self._unpack(sequences[:, input_ids.shape[1] :], tracker, params.num_samples)
                # PreTrainedModel has no generate(); *ForCausalLM classes mix it in (checked below).
                sequences = cast(Any, self._sampling_model).generate(
                    input_ids=input_ids.repeat_interleave(copies, 0) if shared else input_ids,
                    attention_mask=mask.repeat_interleave(copies, 0) if shared else mask,
                    cache=cache,
                    generation_config=self._generation_config(
                        params, seeded=per_prompt is not None, copies=1 if shared else copies
                    ),
                    logits_processor=LogitsProcessorList([logits]),
                    stopping_criteria=StoppingCriteriaList([tracker]),
                )
        except RuntimeError as exc:  # NaN/inf probabilities from diverged weights, out of memory
            log.warning("generation failed for a batch of %d prompts", len(prompts), exc_info=True)
            failed = Sample.failed(f"{type(exc).__name__}: {exc}")
            return [[failed] * params.num_samples for _ in prompts]
        if not isinstance(sequences, torch.Tensor):
            raise TypeError(f"generate returned {type(sequences).__name__}, expected a tensor of token ids")
        return self._unpack(sequences[:, input_ids.shape[1] :], tracker, params.num_samples)

    def _generation_config(self, params: SamplingConfig, *, seeded: bool, copies: int) -> GenerationConfig:
        """Every sampling knob explicit: ``generate`` fills unset ones with defaults such as top-k 50.
        Seeded batches are warped and drawn by ``_RowSampler``, so ``generate`` warps nothing.
        ``copies``: rows ``generate`` makes of each input row (1 when the rows were made already)."""
        # A seeded step's scores are one-hot already: taking the maximum is the draw, without another
        # softmax and multinomial over the vocabulary (greedy cannot expand rows: copies must be 1).
        chosen = seeded and copies == 1
        return GenerationConfig(  # type: ignore[no-untyped-call]
            do_sample=not chosen,
            temperature=None if chosen else 1.0 if seeded else params.temperature,
            top_p=None if chosen else 1.0 if seeded else params.top_p,
            top_k=None if chosen else 0 if seeded else params.top_k,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=copies,
            eos_token_id=self._eos_ids,
            pad_token_id=self._pad_id,
            bos_token_id=self._tokenizer.bos_token_id,
        )

    def _stop_for(self, params: SamplingConfig) -> StopStringCriteria | None:
        """Stop-string matcher, cached per stop tuple (building one scans the vocabulary, ~0.3 s)."""
        if not params.stop:
            return None
        if params.stop not in self._stop_criteria:
            self._stop_criteria[params.stop] = StopStringCriteria(
                tokenizer=self._tokenizer, stop_strings=list(params.stop)
            )
        return self._stop_criteria[params.stop]

    def _unpack(
        self, generated: torch.Tensor, tracker: _CompletionTracker, per_prompt: int
    ) -> list[list[Sample]]:
        """Cut each row after its stop token and group rows by prompt."""
        logprobs = torch.stack(tracker.step_logprobs, dim=1).tolist()
        token_rows = generated.tolist()
        ends = tracker.ends.tolist()
        lengths = [end or len(row) for end, row in zip(ends, token_rows, strict=True)]
        kept = [row[:n] for row, n in zip(token_rows, lengths, strict=True)]
        texts = self._tokenizer.batch_decode(kept, skip_special_tokens=True)
        samples = [
            Sample(
                text=text,
                token_ids=tuple(tokens),
                logprobs=tuple(row_logprobs[: len(tokens)]),
                finish_reason="stop" if end else "length",
            )
            for text, tokens, row_logprobs, end in zip(texts, kept, logprobs, ends, strict=True)
        ]
        return [samples[i : i + per_prompt] for i in range(0, len(samples), per_prompt)]


def _cuda_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []
