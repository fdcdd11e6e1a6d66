"""What the chart's Prometheus queries read of a scrape, checked against real /metrics text.

A query reads metric names and labels: the names its selectors match, the labels their matchers
compare and the values they compare with, the labels its `by`/`without`/`on`/`ignoring` clauses
group or join on, and the labels a dashboard legend prints. `mismatches` says which of them a scrape
does not have. The parsing is what the chart's queries need, not a PromQL parser: every selector of
the chart carries matchers (its namespace), so a selector is a `{...}` with or without a name before it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

TARGET_LABELS = frozenset(
    {"namespace", "job", "instance", "pod", "service", "endpoint", "container", "sapo_node"}
)
"""Labels Prometheus adds to every series of a ServiceMonitor's targets (the chart relabels sapo_node)."""
SCRAPED = frozenset({"up"})
"""Series Prometheus writes for every target itself, never in a target's /metrics."""
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
"""The sample names a family of each type exposes, after its name (a gauge's is its name)."""

_SELECTOR = re.compile(r"(?<![\w:$])([a-zA-Z_:][\w:]*)?\{([^{}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_CLAUSE = re.compile(r"\b(by|without|on|ignoring)\s*\(([^()]*)\)")
_LITERALS = re.compile(r"[\w.:-]+(\|[\w.:-]+)*")


@dataclass
class Scrape:
    """Real /metrics text, merged: the label sets each sample name was seen with, and the sample
    names each declared family may expose (a labelled family no code path counted yet has none)."""

    series: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)

    def add(self, text: str) -> None:
        for family in text_string_to_metric_families(text):
            self.declared.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
            for sample in family.samples:
                labels = self.series.setdefault(sample.name, [])
                if sample.labels not in labels:
                    labels.append(dict(sample.labels))

    def names(self, pattern: str) -> list[str]:
        """The declared sample names `pattern` (a `__name__` regex) matches."""
        return sorted(n for n in self.declared | SCRAPED if re.fullmatch(pattern, n))

    def label_sets(self, names: Iterable[str]) -> list[dict[str, str]]:
        return [labels for name in names for labels in self.series.get(name, [])]


@dataclass(frozen=True)
class Selector:
    """A vector selector of a query: as written, the sample names it selects, where it starts."""

    text: str
    names: tuple[str, ...]
    matchers: tuple[tuple[str, str, str], ...]
    """(label, operator, value) of every matcher but `__name__`'s."""
    start: int


def selectors(expr: str, scrape: Scrape) -> list[Selector]:
    found = []
    for m in _SELECTOR.finditer(expr):
        matchers = [
            (label, op, value.encode().decode("unicode_escape"))
            for label, op, value in _MATCHER.findall(m[2])
        ]
        name_patterns = [value for label, op, value in matchers if label == "__name__" and op == "=~"]
        names = (m[1],) if m[1] else tuple(scrape.names(name_patterns[0])) if name_patterns else ()
        rest = tuple(matcher for matcher in matchers if matcher[0] != "__name__")
        found.append(Selector(m[0], names, rest, m.start()))
    return found


def _argument(expr: str, clause: re.Match[str]) -> tuple[int, int]:
    """The span of the aggregation's parenthesised argument: the one that closes right before the
    clause (`sum(x) by (job)`), else the one that opens after it (`sum by (job) (x)`)."""
    before = expr[: clause.start()].rstrip()
    if before.endswith(")"):
        closed = len(before) - 1
        depth = 0
        for i in range(closed, -1, -1):
            depth += {")": 1, "(": -1}.get(expr[i], 0)
            if depth == 0:
                return i, closed
        raise ValueError(f"unbalanced parentheses in {expr!r}")
    opened = expr.index("(", clause.end())
    depth = 0
    for i in range(opened, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return opened, i
    raise ValueError(f"unbalanced parentheses in {expr!r}")


def _labels_of(text: str) -> list[str]:
    return [label.strip() for label in text.split(",") if label.strip()]


def label_uses(expr: str, legend: str, scrape: Scrape) -> Iterator[tuple[str, list[Selector]]]:
    """(label, the selectors it must come from) for each grouping, join and legend label: a `by` or
    `without` clause's from the selectors of the aggregation's argument, an `on` or `ignoring` one's
    and a legend's from every selector of the query."""
    every = selectors(expr, scrape)
    for m in _CLAUSE.finditer(expr):
        if m[1] in ("by", "without"):
            begin, end = _argument(expr, m)
            scope = [s for s in every if begin < s.start < end]
        else:
            scope = every
        for label in _labels_of(m[2]):
            yield label, scope
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
        yield label, every


def _carries(scrape: Scrape, selector: Selector, label: str) -> bool:
    if label in TARGET_LABELS or (label == "le" and any(n.endswith("_bucket") for n in selector.names)):
        return True
    return any(label in labels for labels in scrape.label_sets(selector.names))


def mismatches(expr: str, scrape: Scrape, legend: str = "") -> list[str]:
    """What `expr` (and its legend) reads that `scrape` lacks, in words; empty when it has it all."""
    problems = []
    for selector in selectors(expr, scrape):
        missing = [n for n in selector.names if n not in scrape.declared | SCRAPED]
        if not selector.names or missing:
            problems.append(f"{selector.text}: no such series {missing or 'name'}")
            continue
        for label, op, value in selector.matchers:
            if label in TARGET_LABELS:
                continue
            if not _carries(scrape, selector, label):
                problems.append(f"{selector.text}: no series carries label {label}")
                continue
            seen = {labels[label] for labels in scrape.label_sets(selector.names) if label in labels}
            if op in ("=", "!="):
                wanted = [value]
            elif _LITERALS.fullmatch(value):
                wanted = value.split("|")
            else:
                wanted = [] if any(re.fullmatch(value, v) for v in seen) else [value]
            unseen = [w for w in wanted if w not in seen]
            if unseen:
                problems.append(f"{selector.text}: {label} is never {unseen}")
    for label, scope in label_uses(expr, legend, scrape):
        lacking = [s.text for s in scope if s.names and not _carries(scrape, s, label)]
        if lacking:
            problems.append(f"label {label} is on no series of {lacking}")
    return problems
