"""Warm-started tiny models (``warm:<seed>``, ``warm-bpe:<seed>``): the paper's experiment at CPU scale.

Why this exists: the bundled 135M model costs 25-60 s per node-round on a 2-core CPU, and a random tiny
model (``tiny:<seed>``) earns reward ~0, so every GRPO group is all-zero and nothing is learned. A warm
model is a tiny Llama of the same family with the bundled SmolLM2 tokenizer (:mod:`sapo.models.tiny`),
briefly fine-tuned on worked examples of the ``easy`` profile so that it starts inside the band where
GRPO has signal: some completions of a question right, some wrong.

Reference: ``warm:<seed>`` (the default recipe below) or ``warm:<seed>:<hidden>x<layers>:<steps>``;
``warm-bpe:`` takes the same forms and builds the same recipe with the project's BPE tokenizer
(:mod:`sapo.models.bpe`) instead of the bundled one: the tokenizer is the only parameter that differs
(measurements in the last section).

Supervised warm-up (SFT):

- Data: questions of the ``easy`` profile's *train* split, from a task stream keyed by the model seed
  (``stable_hash("warm-sft", seed)``, a 64-bit node seed rather than a small swarm node number), so
  the eval split's question texts are never seen and held-out reward measures generalisation. Batch k
  is stream positions [k * B, (k + 1) * B), generated as training goes.
- Prompt: exactly what the generator feeds (``render_prompt`` with its one-shot example and the
  "<answer>" prefill, encoded by ``sapo.generator.encode_prompt``); target ``"{answer}</answer>"`` + EOS,
  encoded on its own because sampling continues from the prompt's ids. The loss is next-token
  cross-entropy on the target tokens only, averaged over them; logits are computed only at those
  positions (per token the 49k-vocabulary head costs ~40x the 64-wide body).
- Optimiser: AdamW (betas 0.9 / 0.98, no weight decay), linear warm-up then a *constant* learning rate.
  With a constant rate, and data that depends only on the step, the model after k steps of a longer
  recipe is exactly the k-step recipe: calibration measures several step counts in one run.
- Init: ``initializer_range`` 0.02, the Llama / SmolLM2 default, rather than tiny's 0.2 (which exists for
  tests that need context-sensitive random logits). SFT progressed the same with either (loss 0.80 /
  0.60 after 100 / 200 steps, measured); calibration was done with 0.02.
- Rows are sorted by length and run in micro-batches of 4 (gradients accumulated, weighted by target
  tokens): the task mix's prompts range from ~90 to ~400 tokens, and padding every row to the longest
  cost ~25% more per step (measured).

Default recipe: 64x2 (3.2 M parameters, 3.1 M of them the tied 49k-token embedding), 300 steps of 16
questions, lr 3e-3 (20 warm-up steps). Measured with bench/calibrate_warm.py (OMP_NUM_THREADS=1, 2-core
AVX2 machine; 64 questions x 4 samples at T=1.0, <= 24 new tokens; node 0's streams; seeds 0 / 1 / 2):

    steps  build_s  train reward         eval reward          train groups with signal
      100     27    0.063 0.077 0.071    0.063 0.048 0.086    0.62-0.69
      200     51    0.198 0.202 0.171    0.168 0.142 0.134    0.56-0.64
      300     74    0.242 0.229 0.221    0.195 0.175 0.178    0.45-0.52
      400      -    0.233 (seed 0)       0.173                0.55      (build timed on a loaded machine only)

- 100 steps is below the band (the format is learnt, ~90% of completions close the tag, answers not);
  from 200 steps every seed is inside it. 300 sits on the plateau (300 and 400 agree within noise), so
  it is the least sensitive to seed and machine while leaving most of the reward to RL; 200 is steeper
  (seed-to-seed 0.17-0.20). Reward comes mostly from calendar_arithmetic (~0.4) and
  propositional_logic (~0.4); basic_arithmetic and fraction_simplification stay <= 0.1.
- Build time: 74 s in the bench and 84 s through ``load_model`` on a mostly idle core; 2-3x that while
  other processes share the two cores. A cached load takes ~0.7 s.
- Train reward runs 0.03-0.05 above eval: the train split of small question spaces (one-digit sums,
  200 leap years) repeats texts the SFT saw (53% of node 0's first 64 train questions at 300 steps),
  and the gap is mostly basic_arithmetic (0.10 vs 0.03). Eval texts are disjoint from all SFT data.
- Wider or faster did not buy reward per second: 128x2 reached 0.17-0.21 at 300-400 steps (64x2 0.17-0.19
  in the same runs) for ~1.5x the build time; lr 1e-2 learnt the format sooner but matched 3e-3 from
  200 steps on.
- RL moves it: plain GRPO (lr 1e-3, 8 x 8 per round, local groups) from the 300-step model raised the
  round reward from 0.18 (rounds 0-9) to 0.30 (rounds 30-39) and held-out reward 0.195 -> 0.256
  (propositional_logic 0.42 -> 0.70) in 40 rounds of ~2 s each. From a 200-step model, GRPO at lr 3e-3
  collapsed onto propositional_logic (calendar 0.19 -> 0.01) where 1e-3 did not.

Determinism: the weights are a pure function of (seed, recipe) for a given torch / transformers /
reasoning-gym build and thread count (training uses no randomness; floating-point reductions may round
differently with another thread count). The cache key includes those versions, so an upgrade rebuilds.

Cache: ``<cache root>/warm/<name>-<digest>``, an ordinary Hugging Face directory (fp32 safetensors +
tokenizer) created through :func:`sapo.models.loading.materialize_dir`: concurrent first loads build it
once and never see a half-written directory; later loads take ~1 s. ``warm-bpe:`` names start with
``warm-bpe-``, and their digest covers the BPE tokenizer's fingerprint.

``warm-bpe:<seed>``, the same recipe with the BPE tokenizer (1024 tokens): 0.14 M parameters instead of
3.2 M (the embedding shrinks from 3.1 M to 65 k), SFT steps get cheaper (~0.17 s instead of ~0.25 s),
and the reward lands where ``warm:``'s does. Measured like the table above (bench/calibrate_warm.py
--tokenizer bpe; build seconds on a busy machine, so only the first row's rate means much):

    steps  build_s  train reward         eval reward          train groups with signal
      100     17    0.130 (seed 0)       0.123                0.67
      200   31-118  0.186 0.191 0.178    0.177 0.171 0.175    0.48-0.67
      300   57-154  0.218 0.236 0.225    0.214 0.169 0.195    0.39-0.50
      400      -    0.220 (seed 0)       0.210                0.53

- Reward comes from the same tasks (propositional_logic ~0.5, calendar_arithmetic ~0.3); ~100% of
  completions close the tag from 200 steps on. Same plateau from 300 steps, same band: the recipe is
  kept rather than re-tuned, so the two families start a heterogeneous swarm on an equal footing.
- Through ``load_model``: 60-90 s to build on a loaded machine (load average ~7 on 2 cores), 1 s cached.
- RL moves it, less clearly than ``warm:0``: plain GRPO (lr 1e-3, 8 x 8 per round, local groups) from
  ``warm-bpe:0`` gave a round reward of 0.22 / 0.32 / 0.20 / 0.34 per 10 rounds over 40 rounds of
  ~1 s, and held-out 0.214 -> 0.226 (propositional_logic 0.49 -> 0.65, calendar_arithmetic
  0.36 -> 0.32): within the noise of a 64-question measurement overall.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from sapo.models.fingerprint import tokenizer_fingerprint
from sapo.models.loading import cache_root, materialize_dir, project_tokenizer, ref_kind
from sapo.models.tiny import TinySpec, build_tiny_model, parse_tiny_ref
from sapo.tasks import EASY_PROFILE, GENERATOR_VERSION, Profile, QuestionRecord, TaskStream, render_prompt
from sapo.tasks.reward import ANSWER_CLOSE
from sapo.tasks.seeds import stable_hash

log = logging.getLogger(__name__)

WARM_PROFILE: Profile = EASY_PROFILE
"""The tasks a warm model is fine-tuned on (and meant to be RL-trained on)."""

RECIPE_VERSION = 1
"""Bumped whenever the training procedure changes, so cached models of the old recipe are not reused."""

DEFAULT_SPEC = TinySpec(hidden_size=64, num_hidden_layers=2, initializer_range=0.02)
DEFAULT_STEPS = 300
"""SFT steps of ``warm:<seed>``: on the reward plateau, inside the useful band (module docstring)."""
MICRO_BATCH_ROWS = 4

_WARM_REF = re.compile(
    r"(?P<kind>warm|warm-bpe):(?P<seed>\d+)(?::(?P<hidden>\d+)x(?P<layers>\d+):(?P<steps>\d+))?"
)


@dataclass(frozen=True)
class WarmRecipe:
    """How a warm model is built: architecture, SFT steps and optimiser settings."""

    spec: TinySpec = DEFAULT_SPEC
    steps: int = DEFAULT_STEPS
    learning_rate: float = 3e-3
    batch_size: int = 16
    warmup_steps: int = 20

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.batch_size < 1 or self.warmup_steps < 0:
            raise ValueError("batch_size must be >= 1 and warmup_steps >= 0")

    def learning_rate_at(self, step: int) -> float:
        """Learning rate of 1-based ``step``: linear warm-up, then constant (see the module docstring)."""
        if self.warmup_steps == 0:
            return self.learning_rate
        return self.learning_rate * min(1.0, step / self.warmup_steps)


def parse_warm_ref(model_ref: str) -> tuple[int, WarmRecipe]:
    """Parse ``warm:<seed>`` or ``warm:<seed>:<hidden>x<layers>:<steps>`` into a seed and a recipe;
    ``warm-bpe:`` takes the same forms (the kind only picks the tokenizer, see ``warm_model_dir``).

    Sizes follow ``tiny:<seed>:<hidden>x<layers>`` (heads = hidden / 16), with the warm init range.
    """
    match = _WARM_REF.fullmatch(model_ref)
    if match is None:
        kind = "warm-bpe" if model_ref.startswith("warm-bpe:") else "warm"
        raise ValueError(
            f"bad warm model reference {model_ref!r}; "
            f"use {kind}:<seed> or {kind}:<seed>:<hidden>x<layers>:<steps>"
        )
    seed = int(match["seed"])
    if match["hidden"] is None:
        return seed, WarmRecipe()
    _, tiny = parse_tiny_ref(f"tiny:{seed}:{match['hidden']}x{match['layers']}")
    spec = dataclasses.replace(tiny, initializer_range=DEFAULT_SPEC.initializer_range)
    return seed, WarmRecipe(spec=spec, steps=int(match["steps"]))


@dataclass(frozen=True)
class SftExample:
    """One worked example: the generator's prompt ids and the target ids the loss is computed on."""

    record: QuestionRecord
    prompt_ids: tuple[int, ...]
    target_ids: tuple[int, ...]


def sft_stream(seed: int) -> TaskStream:
    """The training-split question stream a warm model with ``seed`` is fine-tuned on."""
    return TaskStream(WARM_PROFILE, stable_hash("warm-sft", seed), "train")


def sft_example(tokenizer: PreTrainedTokenizerBase, record: QuestionRecord) -> SftExample:
    """The prompt exactly as the generator encodes it, and ``"{answer}</answer>"`` + EOS as the target."""
    # Imported here: sapo.generator imports sapo.generation, which loads models through this package.
    from sapo.generator.groups import encode_prompt

    if tokenizer.eos_token_id is None:
        raise ValueError("a warm model needs a tokenizer with an EOS token (the target ends with it)")
    prompt = encode_prompt(tokenizer, render_prompt(tokenizer, record))
    answer = tokenizer.encode(f"{record.answer}{ANSWER_CLOSE}", add_special_tokens=False)
    return SftExample(record, prompt, (*(int(i) for i in answer), int(tokenizer.eos_token_id)))


def _answer_nll_sum(model: LlamaForCausalLM, examples: Sequence[SftExample]) -> torch.Tensor:
    """Summed next-token NLL of the target tokens of ``examples``, run as one right-padded batch.

    Right padding keeps every real token at its unpadded position, the one it has when sampled
    (``sapo.grpo.layout``). The body runs on every position, the LM head only on the positions that
    predict a target token.
    """
    width = max(len(e.prompt_ids) + len(e.target_ids) for e in examples)
    pad = model.config.pad_token_id or 0  # any id: padding follows every real token and is never a target
    input_ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    targets: list[int] = []
    for row, example in enumerate(examples):
        sequence = [*example.prompt_ids, *example.target_ids]
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        first = len(example.prompt_ids)
        rows.extend([row] * len(example.target_ids))
        cols.extend(range(first - 1, first - 1 + len(example.target_ids)))
        targets.extend(example.target_ids)
    positions = torch.arange(width).expand(len(examples), width)
    hidden = model.model(input_ids=input_ids, attention_mask=mask, position_ids=positions).last_hidden_state
    logits = model.lm_head(hidden[torch.tensor(rows), torch.tensor(cols)])
    return torch.nn.functional.cross_entropy(logits.float(), torch.tensor(targets), reduction="sum")


def _micro_batches(examples: Sequence[SftExample]) -> list[list[SftExample]]:
    """Examples sorted by length in chunks of MICRO_BATCH_ROWS, so rows of a chunk pad little."""
    ordered = sorted(examples, key=lambda e: len(e.prompt_ids) + len(e.target_ids))
    return [ordered[i : i + MICRO_BATCH_ROWS] for i in range(0, len(ordered), MICRO_BATCH_ROWS)]


def answer_loss(model: LlamaForCausalLM, examples: Sequence[SftExample]) -> float:
    """Mean next-token loss per target token (nats), without gradient: what SFT minimises."""
    tokens = sum(len(e.target_ids) for e in examples)
    with torch.no_grad():
        total = sum(float(_answer_nll_sum(model, chunk)) for chunk in _micro_batches(examples))
    return total / tokens


def _backward_answer_loss(model: LlamaForCausalLM, examples: Sequence[SftExample]) -> float:
    """Accumulate the gradient of the mean target-token loss of ``examples``; return that loss."""
    tokens = sum(len(e.target_ids) for e in examples)
    total = 0.0
    for chunk in _micro_batches(examples):
        loss = _answer_nll_sum(model, chunk) / tokens
        loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    return total


StepCallback = Callable[[int, LlamaForCausalLM, float], None]
"""Called after each optimiser step with (1-based step, model in train mode, that step's loss)."""


def train_warm_model(
    tokenizer: PreTrainedTokenizerBase,
    seed: int,
    recipe: WarmRecipe | None = None,
    *,
    callback: StepCallback | None = None,
) -> LlamaForCausalLM:
    """Build ``tiny`` weights from ``seed`` and fine-tune them with ``recipe``; returned in eval mode.

    Deterministic in (seed, recipe): the init uses a forked RNG and training draws no random numbers
    (the config has no dropout). The global RNG is left untouched.
    """
    recipe = recipe or WarmRecipe()
    model = build_tiny_model(tokenizer, seed=seed, spec=recipe.spec)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, betas=(0.9, 0.98), weight_decay=0.0
    )
    stream = sft_stream(seed)
    for step in range(1, recipe.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = recipe.learning_rate_at(step)
        batch = [sft_example(tokenizer, record) for record in stream.take(recipe.batch_size)]
        optimizer.zero_grad(set_to_none=True)
        loss = _backward_answer_loss(model, batch)
        optimizer.step()
        if callback is not None:
            callback(step, model, loss)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _cache_name(seed: int, recipe: WarmRecipe, tokenizer: PreTrainedTokenizerBase, kind: str = "warm") -> str:
    """Directory name: kind, readable size and steps, plus a digest of everything the weights depend on
    (the tokenizer's fingerprint tells the two kinds apart in the digest too)."""
    identity = {
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "recipe": dataclasses.asdict(recipe),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "tasks": GENERATOR_VERSION,
        "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers"),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    spec = recipe.spec
    return f"{kind}-{seed}-{spec.hidden_size}x{spec.num_hidden_layers}-{recipe.steps}-{digest}"


def warm_model_dir(model_ref: str) -> Path:
    """Cached Hugging Face directory of a ``warm:`` or ``warm-bpe:`` model, built on first use."""
    seed, recipe = parse_warm_ref(model_ref)
    kind = ref_kind(model_ref)
    tokenizer = project_tokenizer(model_ref)

    def build(target: Path) -> None:
        log.info("building %s once (supervised warm-up, %d steps)", model_ref, recipe.steps)
        start = time.perf_counter()
        model = train_warm_model(tokenizer, seed, recipe)
        model.save_pretrained(str(target), safe_serialization=True)
        tokenizer.save_pretrained(str(target))
        log.info("built %s in %.1f s", model_ref, time.perf_counter() - start)

    return materialize_dir(cache_root() / "warm" / _cache_name(seed, recipe, tokenizer, kind), build)
