"""A second tokenizer family, built offline: byte-level BPE trained on the project's own task text.

Why: SAPO nodes share decoded *text*, so a swarm may mix models whose tokenizers disagree; every other
model reference (``bundled:``, ``tiny:``, ``warm:``) uses the bundled SmolLM2 tokenizer, so without a
second tokenizer that path (re-tokenizing a peer's text, ignoring its ids and log-probs) would never run.
Nothing may be downloaded, so the tokenizer is trained here, once, and cached.

Choices:

- Byte-level BPE (``tokenizers``, the GPT-2 / SmolLM2 scheme): the 256 byte symbols are always in the
  vocabulary, so *any* text (a peer's garbage, emoji, the logic task's ``∧ → ¬``) encodes without an
  unknown token and decodes back to exactly itself. Digits are split one per token before BPE (as in
  SmolLM2 and Llama), so numbers are composed from ten tokens rather than memorised chunks.
- Vocabulary 1024 (6 special + 256 bytes + 762 merges): trained on prompt-shaped task text it already
  encodes the project's prompts in fewer tokens than SmolLM2's 49k vocabulary does (mean of 200 eval
  prompts: easy 161 vs 175, paper 276 vs 291, measured), and the corpus runs out of pairs seen twice
  at 1439 tokens, which would shorten prompts by < 1%: a larger target would be neither reached nor
  useful. A small vocabulary also makes the tiny models cheap: the embedding of ``warm:`` models is
  3.1 M of their 3.2 M parameters, here it is 65 k.
- Corpus: 1000 train-split questions of each built-in profile (``easy`` and ``paper``) from a stream of
  their own, each as the generator's conversation (system prompt, worked example, question, answer in
  tags) without role markup; 1.4 MB, generated in ~2 s, trained on in < 1 s. Eval-split texts are
  never read.
- Special tokens, ids 0-5: ``<|pad|>`` (pad, distinct from EOS), ``<|begin|>`` (BOS), ``<|end|>`` (EOS,
  also the end of every chat turn, so a reply learns to stop with it), and the role markers
  ``<|system|>``, ``<|user|>``, ``<|assistant|>``. No unknown token: byte-level BPE needs none.
- Chat template (Zephyr-like, deliberately not ChatML, so the two families also differ in prompt
  format): ``<|begin|>`` then per message ``<|role|>\\n{content}<|end|>\\n``, and ``<|assistant|>\\n`` as the
  generation prompt. The template writes BOS itself; ``sapo.tasks.encode_prompt`` therefore encodes
  with ``add_special_tokens=False``, and the tokenizer has no post-processor adding anything either
  way. The project's prompt (``sapo.tasks.render_prompt``) ends in the ``<answer>`` prefill, a reply is
  ``{answer}</answer>`` then EOS, and the trainer re-tokenizes a peer's text with
  ``add_special_tokens=False`` and appends ``<|end|>`` when the peer's generation stopped.
- ``</answer>`` stays ordinary text (three tokens), not an added token: an added special token would be
  dropped by ``decode(skip_special_tokens=True)`` and the verifier would never see the closed tag.

Determinism: the result is a pure function of the corpus and these settings for one ``tokenizers``
build (measured: byte-identical ``tokenizer.json`` from separate processes with different hash seeds),
and the corpus is a pure function of the task generator version. The cache key holds both versions.

Cache: ``<cache root>/bpe/bpe-<vocab>-<digest>``, a Hugging Face tokenizer directory created through
:func:`sapo.models.cache.materialize_dir` (concurrent first loads build it once).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from sapo.models.cache import cache_root, materialize_dir
from sapo.tasks import EASY_PROFILE, GENERATOR_VERSION, PAPER_PROFILE, TaskStream, build_messages
from sapo.tasks.reward import ANSWER_CLOSE, ANSWER_OPEN
from sapo.tasks.seeds import stable_hash

TOKENIZER_VERSION = 1
"""Bumped whenever the corpus, the settings or the template change, so old cache entries are not reused."""

VOCAB_SIZE = 1024
CORPUS_QUESTIONS = 1000
"""Questions per built-in profile in the training corpus."""

PAD, BOS, EOS = "<|pad|>", "<|begin|>", "<|end|>"
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, *(f"<|{role}|>" for role in ROLES))
"""Ids 0 .. 5, in this order."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant, not ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def bpe_corpus(questions: int = CORPUS_QUESTIONS) -> list[str]:
    """The training text: per built-in profile, ``questions`` conversations of its own train stream."""
    documents = []
    for name, profile in (("easy", EASY_PROFILE), ("paper", PAPER_PROFILE)):
        for record in TaskStream(profile, stable_hash("bpe-corpus", name), "train").take(questions):
            turns = [message["content"] for message in build_messages(record)]
            documents.append("\n".join([*turns, f"{ANSWER_OPEN}{record.answer}{ANSWER_CLOSE}"]))
    return documents


def train_bpe_tokenizer(corpus: Sequence[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus`` with this module's special tokens and template."""
    if vocab_size <= len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS) + 256} special and byte tokens")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _cache_name() -> str:
    identity = {
        "version": TOKENIZER_VERSION,
        "vocab_size": VOCAB_SIZE,
        "corpus_questions": CORPUS_QUESTIONS,
        "tasks": GENERATOR_VERSION,
        "tokenizers": importlib.metadata.version("tokenizers"),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"bpe-{VOCAB_SIZE}-{digest}"


def bpe_tokenizer_dir() -> Path:
    """Cached Hugging Face directory of the BPE tokenizer (built on first use, a few seconds)."""

    def build(target: Path) -> None:
        train_bpe_tokenizer(bpe_corpus()).save_pretrained(str(target))

    return materialize_dir(cache_root() / "bpe" / _cache_name(), build)


def load_bpe_tokenizer() -> PreTrainedTokenizerBase:
    """The project's BPE tokenizer, from the cache."""
    return AutoTokenizer.from_pretrained(str(bpe_tokenizer_dir()), local_files_only=True)
