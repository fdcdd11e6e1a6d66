"""The prompt: a system instruction, one worked example of the same task, the question, and "<answer>".

Measured on the bundled 135M model: without an example it almost never tags its answer (reward ~0);
one worked example in the chat history plus the assistant turn pre-filled with "<answer>" gives 60-100%
tagged answers. The completion therefore continues right after "<answer>" and generation stops at "</answer>".

The example depends only on the question's provenance: any node (any tokenizer) rebuilds the same
conversation for a shared question. It comes from a seed range of its own and from the training half of
the text space (`sapo.tasks.seeds`), so it never shows an eval question, and its reply is its
ground-truth answer.
"""

from __future__ import annotations

from typing import Any, Protocol

from sapo.tasks.records import QuestionRecord
from sapo.tasks.reward import ANSWER_CLOSE, ANSWER_OPEN
from sapo.tasks.seeds import DATASET_SIZE, derive_seed, stable_hash
from sapo.tasks.stream import ATTEMPTS_PER_POSITION, first_scorable

SYSTEM_PROMPT = (
    "You solve reasoning problems. Work out the problem, then give only the final answer between "
    f"{ANSWER_OPEN} and {ANSWER_CLOSE} tags, in exactly the format the question and the example use."
)
ANSWER_PREFILL = ANSWER_OPEN
"""Appended after the generation prompt: the model's completion starts inside the answer tag."""
STOP_STRINGS: tuple[str, ...] = (ANSWER_CLOSE,)
"""Generation stops once the answer tag closes."""


class ChatTokenizer(Protocol):
    """What `render_prompt` needs from a tokenizer (a transformers tokenizer satisfies it)."""

    chat_template: str | None

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        """Render a conversation with the model's chat template."""
        ...


class PromptTokenizer(ChatTokenizer, Protocol):
    """What encoding a rendered prompt needs on top (a transformers tokenizer satisfies it)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text."""
        ...


def example_for(record: QuestionRecord) -> QuestionRecord:
    """The worked example shown before `record`: same task and config, chosen by the record's provenance."""
    provenance = record.provenance
    seed = derive_seed("example", provenance.dataset, provenance.config_digest)
    first_index = stable_hash(provenance.seed, provenance.index) % (DATASET_SIZE - ATTEMPTS_PER_POSITION)
    return first_scorable(
        provenance.dataset,
        provenance.config_json,
        seed,
        first_index,
        "train",  # from the training half of the text space, so an example never shows an eval question
        attempts=ATTEMPTS_PER_POSITION,
    )


def build_messages(record: QuestionRecord) -> list[dict[str, str]]:
    """Chat messages up to the question; the assistant turn is opened by `render_prompt`."""
    example = example_for(record)
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": example.text},
        {"role": "assistant", "content": f"{ANSWER_OPEN}{example.answer}{ANSWER_CLOSE}"},
        {"role": "user", "content": record.text},
    ]


def render_prompt(tokenizer: ChatTokenizer, record: QuestionRecord) -> str:
    """The prompt text for `record`, ending in ANSWER_PREFILL.

    Uses the tokenizer's chat template with the generation prompt. A tokenizer without one (a tiny
    test tokenizer, a base model) gets `render_plain`.
    """
    messages = build_messages(record)
    if getattr(tokenizer, "chat_template", None) is None:
        return render_plain(messages)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if not isinstance(rendered, str):
        raise TypeError(
            f"apply_chat_template(tokenize=False) returned {type(rendered).__name__}, expected str"
        )
    return rendered + ANSWER_PREFILL


def render_plain(messages: list[dict[str, str]]) -> str:
    """Template-free format: the system text, then "User: ..." / "Assistant: ..." blocks separated by
    blank lines, ending in an open "Assistant: " turn followed by ANSWER_PREFILL.
    """
    blocks = []
    for message in messages:
        if message["role"] == "system":
            blocks.append(message["content"])
        else:
            blocks.append(f"{message['role'].capitalize()}: {message['content']}")
    blocks.append(f"Assistant: {ANSWER_PREFILL}")
    return "\n\n".join(blocks)


def encode_prompt(tokenizer: PromptTokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a rendered prompt.

    A chat template already writes every special token the model expects (BOS included where it has
    one), so letting the tokenizer add its own would double them; a template-free prompt
    (`render_plain`) gets the tokenizer's usual special tokens instead.
    """
    ids = tokenizer.encode(text, add_special_tokens=tokenizer.chat_template is None)
    return tuple(int(i) for i in ids)


def prompt_ids(tokenizer: PromptTokenizer, record: QuestionRecord) -> tuple[int, ...]:
    """The prompt of `record` as the generator samples from it: rendered, then encoded."""
    return encode_prompt(tokenizer, render_prompt(tokenizer, record))
