"""Each service's catalogue of refusals (`REFUSALS`: every reason its loops reject or dead-letter a
record for, exposed at 0 from the start) against the code that refuses and against the contract."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sapo.identity import HOSTILE
from sapo.node import generator, sampler, trainer
from sapo.node.metrics import SKIP_REASONS
from sapo.sampler import REASONS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
CATALOGUES = {"generator": generator.REFUSALS, "sampler": sampler.REFUSALS, "trainer": trainer.REFUSALS}
EVERY_LOOP = {"sapo/kafka/consumer.py": None, "sapo/kafka/chunks.py": None, "sapo/wire.py": {"decode"}}
PRODUCERS: dict[str, dict[str, set[str] | None]] = {
    "generator": {
        "sapo/node/generator.py": None,
        "sapo/node/policy.py": None,
        "sapo/wire.py": {"validate_work_item", "validate_policy_update"},
    },
    "sampler": {
        "sapo/node/sampler.py": None,
        "sapo/node/trained.py": None,
        "sapo/node/lease.py": None,
        "sapo/node/identity.py": None,
        "sapo/sampler/screen.py": None,
        "sapo/sampler/sender.py": None,
        "sapo/convert.py": None,
        "sapo/tasks/verify.py": None,
        "sapo/identity/trust.py": None,
        "sapo/wire.py": {
            "validate_rollout_group",
            "_validate_completions",
            "read_facts",
            "facts_problem",
            "validate_policy_update",
        },
    },
    "trainer": {
        "sapo/node/trainer.py": None,
        "sapo/node/lease.py": None,
        "sapo/wire.py": {"validate_batch"},
    },
}
"""Where each service's loops get their reasons from (module -> the functions that give them, None for
all of it), besides what every loop gives (`EVERY_LOOP`)."""
REFUSING = {"InvalidMessageError", "Incomplete", "RederivationError", "Rejection"}
"""Exceptions and values whose first argument is a reason."""
VALIDATORS = ("header_reason", "verify_question")
"""Functions that return a reason to refuse with, besides `validate_*` and `*_problem`."""
REASON = re.compile(r"[a-z][a-z0-9_]*")
"""What a reason looks like (a bounded metric label), unlike a message."""


def _strings(node: ast.expr | None, names: dict[str, str]) -> Iterator[str]:
    """The reasons `node` may evaluate to: a constant, one of the module's string constants (`names`),
    or either side of an `if` expression."""
    if isinstance(node, ast.Name) and node.id in names:
        yield names[node.id]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and REASON.fullmatch(node.value):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body, names)
        yield from _strings(node.orelse, names)


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's top-level `NAME = "reason"` (annotated or not)."""
    found = {}
    for node in tree.body:
        target: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _validator(name: str) -> bool:
    """A function that returns a reason (or None) for its caller to refuse with."""
    return name.lstrip("_").startswith("validate_") or name.endswith("_problem") or name in VALIDATORS


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _gives_reason(func: ast.expr) -> bool:
    """A dead letter's `send(record, reason, ...)` or the reassembler's `_give_up(slot, reason, ...)`."""
    if not isinstance(func, ast.Attribute):
        return False
    receiver = ast.unparse(func.value)
    return func.attr == "_give_up" or (
        func.attr == "send" and ("dead_letters" in receiver or "dlq" in receiver)
    )


def written_reasons(path: str, functions: set[str] | None) -> set[str]:
    """The reasons written out in `functions` of the module at `path`: a refusal's first argument, the
    reason given to a dead letter or to a given-up message, a validator's return value and a `problem`
    that is raised later."""
    tree = ast.parse((ROOT / path).read_text())
    names = _constants(tree)
    scopes = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and (functions is None or node.name in functions)
    ]
    found: set[str] = set()
    for scope in scopes:
        validator = _validator(scope.name)
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and node.args:
                name = _name(node.func)
                if name in REFUSING:
                    reasons = set(_strings(node.args[0], names))
                    found |= {r for r in reasons if r in HOSTILE} if name == "Rejection" else reasons
                elif _gives_reason(node.func) and len(node.args) > 1:
                    found |= set(_strings(node.args[1], names))
            elif (isinstance(node, ast.Return) and validator) or (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "problem" for t in node.targets)
            ):
                found |= set(_strings(node.value, names))
    return found


def test_every_reason_a_service_refuses_for_is_in_its_catalogue() -> None:
    for service, modules in PRODUCERS.items():
        written = set().union(*(written_reasons(p, f) for p, f in [*EVERY_LOOP.items(), *modules.items()]))
        assert {"bad_header", "undecodable", "oversized"} <= written, "the scan found nothing: out of date"
        missing = sorted(written - set(CATALOGUES[service]))
        assert not missing, f"{service} refuses for reasons its REFUSALS lacks: {missing}"


def test_every_module_that_refuses_records_is_a_producer_of_some_service() -> None:
    """A new module that writes out refusals must say which services' loops it refuses for."""
    known = set(EVERY_LOOP) | {path for modules in PRODUCERS.values() for path in modules}
    refusing = set()
    for path in (ROOT / "sapo").rglob("*.py"):
        relative = str(path.relative_to(ROOT))
        if relative.startswith(("sapo/conformance/", "sapo/v1/")):  # the kit's expectations; generated
            continue
        if written_reasons(relative, None):
            refusing.add(relative)
    assert sorted(refusing - known) == []


def test_catalogues_are_bounded_label_values() -> None:
    for service, reasons in CATALOGUES.items():
        assert len(reasons) == len(set(reasons)) and len(reasons) < 100, service
        assert all(REASON.fullmatch(r) for r in reasons), service


CONTRACT_SECTIONS: dict[str, list[tuple[str, ...]]] = {
    "### 5.5": [("generator",), ("sampler",), ("trainer",)],
    "## 6.": [("generator", "sampler", "trainer")],
    "### 7.2": [("generator",)],
    "### 8.2": [("sampler",)],
    "### 9.1": [("trainer",)],
    "### 9.2": [("trainer",)],
}
"""Sections of docs/contract.md that name refusals, and the services that refuse so: each of the
groups, by at least one service of a group (section 6 is about the readers of the leases and of the
policy topic, which are of several services)."""


def contract_section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}")
    end = re.search(r"\n#{2,3} ", text[start + 1 :])
    return text[start : start + 1 + end.start()] if end else text[start:]


NOT_REASONS = {
    *("epoch", "renewed_at", "ttl_s", "manifest_sha256", "completed_at", "config_digest", "node_id"),
    *("max_clock_skew_s", "max_external_age_s", "max_policy_lag", "strict", "tofu", "v"),
}
"""What those sections name in code spans that is no reason: fields, settings, modes (metric names,
`sapo_*`, neither)."""


def test_the_reasons_the_contract_names_are_in_the_catalogues_of_the_services_it_names() -> None:
    """The contract names refusals by example (its lists end in "..." and describe the rest), so each
    reason it names is checked against the catalogue of the services its section is about; the
    counted-only reasons of the sampler's groups (`sapo.sampler.REASONS`) and the trainer's skipped
    completions (`SKIP_REASONS`) are theirs."""
    text = (ROOT / "docs" / "contract.md").read_text()
    counted: dict[str, set[str]] = {"sampler": set(REASONS), "trainer": set(SKIP_REASONS), "generator": set()}
    checked = 0
    for heading, groups in CONTRACT_SECTIONS.items():
        spans = set(re.findall(r"`([a-z][a-z0-9_]*)`", contract_section(text, heading)))
        named = {span for span in spans if not span.startswith("sapo_")} - NOT_REASONS
        for services in groups:
            known = set().union(*(set(CATALOGUES[s]) | counted[s] for s in services))
            wrong = sorted(named - known)
            assert not wrong, f"docs/contract.md {heading} names for the {'/'.join(services)} {wrong}"
            checked += len(named)
    assert checked > 40, "the contract names fewer reasons than it did: CONTRACT_SECTIONS is out of date"
