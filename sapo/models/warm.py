"""Warm-started tiny models (``warm:<seed>``, ``warm-bpe:<seed>``): the paper's experiment at CPU scale.

The bundled 135M model costs 25-60 s per node-round on a 2-core CPU, and a random tiny model
(``tiny:<seed>``) earns reward ~0, so GRPO has no signal. A warm model is a tiny Llama of the same
family (:mod:`sapo.models.tiny`) briefly fine-tuned on worked examples of the ``easy`` profile so that it
starts where GRPO has signal: some completions of a question right, some wrong. ``warm-bpe:`` builds
the same recipe with the project's BPE tokenizer (:mod:`sapo.models.bpe`).

Reference: ``warm:<seed>`` (the default recipe below) or ``warm:<seed>:<hidden>x<layers>:<steps>``.

Supervised warm-up: questions of the ``easy`` profile's train split from a stream keyed by the model
seed (so held-out reward measures generalisation); the prompt exactly as the generator encodes it
(``sapo.tasks.prompt_ids``), target ``"{answer}</answer>"`` + EOS; next-token cross-entropy on the
target tokens only; AdamW, linear warm-up then a constant rate, so the model after k steps of a longer
recipe is exactly the k-step recipe. Default recipe: 64x2 (3.2 M parameters), 300 steps of 16
questions, lr 3e-3; docs/models.md has the calibration that chose it and what was measured.

Determinism: the weights are a pure function of (seed, recipe) for a given torch / transformers /
reasoning-gym build and thread count. The cache key includes those versions, so an upgrade rebuilds.
Cache: ``<cache root>/warm/<name>-<digest>``, an ordinary Hugging Face directory built through
:func:`sapo.models.cache.materialize_dir`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from sapo.models.cache import cache_root, materialize_dir
from sapo.models.fingerprint import tokenizer_fingerprint
from sapo.models.refs import WARM_REF, ref_kind
from sapo.models.tiny import TinySpec, build_tiny_model, parse_tiny_ref
from sapo.models.tokenizer import project_tokenizer
from sapo.tasks import (
    EASY_PROFILE,
    GENERATOR_VERSION,
    Profile,
    QuestionRecord,
    TaskStream,
    prompt_ids,
)
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
    match = WARM_REF.fullmatch(model_ref)
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
    if tokenizer.eos_token_id is None:
        raise ValueError("a warm model needs a tokenizer with an EOS token (the target ends with it)")
    prompt = prompt_ids(tokenizer, record)
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
