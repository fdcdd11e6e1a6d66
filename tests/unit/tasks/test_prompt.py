"""The one-shot prompt: same-task worked example, chat template, "<answer>" pre-fill."""

from __future__ import annotations

from typing import Any

import pytest

from sapo.tasks import (
    ANSWER_PREFILL,
    PAPER_PROFILE,
    STOP_STRINGS,
    SYSTEM_PROMPT,
    build_messages,
    render_prompt,
)
from sapo.tasks.prompt import example_for
from sapo.tasks.reward import reference_reward
from sapo.tasks.seeds import seed_in_split
from tests.unit.tasks.cases import records_of

pytestmark = pytest.mark.unit


class FakeTokenizer:
    """A chat-template tokenizer that renders role tags and records how it was called."""

    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in conversation)
        return text + ("<|assistant|>" if kwargs.get("add_generation_prompt") else "")


def test_messages_hold_a_worked_example_of_the_same_task() -> None:
    record = records_of(PAPER_PROFILE[1], 1)[0]  # basic_arithmetic
    messages = build_messages(record)
    example = example_for(record)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT
    assert messages[1]["content"] == example.text != record.text
    assert messages[2]["content"] == f"<answer>{example.answer}</answer>"
    assert messages[3]["content"] == record.text
    assert example.task == record.task
    assert example.provenance.config_json == record.provenance.config_json
    assert reference_reward(example) == 1.0


def test_examples_are_deterministic_and_drawn_apart_from_train_and_eval() -> None:
    records = records_of(PAPER_PROFILE[8], 5)  # propositional_logic
    examples = [example_for(r) for r in records]
    assert examples == [example_for(r) for r in records]
    assert len({e.text for e in examples}) > 1
    for example in examples:
        assert not seed_in_split(example.provenance.seed, "train")
        assert not seed_in_split(example.provenance.seed, "eval")


def test_render_prompt_uses_the_chat_template_and_prefills_the_answer_tag() -> None:
    record = records_of(PAPER_PROFILE[5], 1)[0]
    tokenizer = FakeTokenizer(chat_template="fake")
    prompt = render_prompt(tokenizer, record)
    assert tokenizer.calls == [{"add_generation_prompt": True, "tokenize": False}]
    assert prompt.endswith(f"{record.text}\n<|assistant|>{ANSWER_PREFILL}")
    assert ANSWER_PREFILL == "<answer>"
    assert STOP_STRINGS == ("</answer>",)


def test_tokenizer_without_template_gets_the_plain_format() -> None:
    record = records_of(PAPER_PROFILE[5], 1)[0]
    tokenizer = FakeTokenizer(chat_template=None)
    prompt = render_prompt(tokenizer, record)
    assert tokenizer.calls == []
    assert prompt.startswith(SYSTEM_PROMPT + "\n\nUser: ")
    assert prompt.endswith(f"User: {record.text}\n\nAssistant: <answer>")
