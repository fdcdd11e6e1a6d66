"""Output of `sapo inspect`: a table for people (`rich`), JSON lines for programs, and summaries.

The table streams: rows are printed in chunks as they are read, every column but the last has a fixed
width so chunks line up under one header, and memory stays flat however long the read. Following a
topic in a terminal adds a live status line below the rows (`rich.live`); the summary is redrawn in
place. Into a pipe or file, nothing is redrawn: rows as they come, the summary once at the end.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from datetime import UTC, datetime
from typing import IO, Any, Final

from rich import box
from rich.console import Console, Group, JustifyMethod
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sapo.inspect.decode import Entry
from sapo.inspect.summary import GROUPINGS, PERCENTILES, Summary, Tally

#: (header, width, justify) of the fixed columns; the details column takes what is left.
COLUMNS: Final[tuple[tuple[str, int, JustifyMethod], ...]] = (
    ("time (UTC)", 18, "left"),
    ("topic", 16, "left"),
    ("p:offset", 8, "right"),
    ("type", 13, "left"),
    ("node", 10, "left"),
    ("task", 23, "left"),  # fraction_simplification
    ("round", 5, "right"),
    ("ver", 3, "right"),
    ("bytes", 6, "right"),
)
#: Columns are two spaces apart (rich's padding of one on each side, collapsed).
GAP: Final = 2
SIZE_COLUMNS: Final = (*(f"size p{p}" for p in PERCENTILES), "size max")
CHUNK_ROWS: Final = 100
PIPE_WIDTH: Final = 240
_TOPIC_RE: Final = re.compile(r"\.(?:node\.([a-z0-9-]+)|(swarm))\.([A-Za-z0-9_-]+)$")


def console_for(stream: IO[str]) -> Console:
    """A console on `stream`; into a pipe or file it is wide (COLUMNS still wins) and uncoloured."""
    console = Console(file=stream)
    if not console.is_terminal and console.width == 80:
        console = Console(file=stream, width=PIPE_WIDTH)
    return console


def topic_label(topic: str) -> str:
    """`sapo.node.n0.dlq` -> `n0/dlq`, `sapo.swarm.rollouts` -> `swarm/rollouts`, others unchanged."""
    match = _TOPIC_RE.search(topic)
    return f"{match.group(1) or match.group(2)}/{match.group(3)}" if match else topic


def format_time(timestamp_ms: int) -> str:
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    return moment.strftime("%m-%d %H:%M:%S.%f")[:-3]


def details(entry: Entry) -> str:
    """The last column: the DLQ reason, then the summary, or why it did not decode and its headers."""
    parts = []
    if entry.dlq_reason:
        detail = f": {entry.dlq_detail}" if entry.dlq_detail else ""
        parts.append(f"[{entry.dlq_reason}] by {entry.dlq_service or '?'} from {entry.dlq_source}{detail}")
    if entry.error:
        headers = " ".join(f"{k}={v}" for k, v in entry.headers.items() if not k.startswith("sapo-dlq-"))
        reason, _, detail = entry.error.partition(": ")
        parts.append(f"{reason}; headers: {headers or 'none'}" + (f"; {detail}" if detail else ""))
    elif entry.summary:
        parts.append(entry.summary)
    return " | ".join(parts)


def _optional(value: int | None) -> str:
    return "-" if value is None else str(value)


def row(entry: Entry) -> list[str]:
    return [
        format_time(entry.timestamp_ms),
        topic_label(entry.topic),
        f"{entry.partition}:{entry.offset}",
        entry.type,
        entry.node or "-",
        ",".join(entry.tasks) or "-",
        _optional(entry.round),
        _optional(entry.policy_version),
        str(entry.size),
        details(entry),
    ]


def entry_json(entry: Entry) -> str:
    data = dataclasses.asdict(entry)
    data["tasks"] = list(entry.tasks)
    if entry.payload is None:
        del data["payload"]
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class JsonLines:
    """One JSON object per entry, flushed per line so a pipe sees it at once."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def add(self, entry: Entry) -> None:
        self._stream.write(entry_json(entry) + "\n")
        self._stream.flush()

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass


class TableRows:
    """Rows printed in fixed-width chunks, with a live status line when following in a terminal."""

    def __init__(self, console: Console, follow: bool) -> None:
        self._console = console
        self._pending: list[Entry] = []
        self._shown = 0
        self._last_shown = time.monotonic()
        self._live = Live(self._status(), console=console, auto_refresh=False, transient=True)
        self._use_live = follow and console.is_terminal
        if self._use_live:
            self._live.start()

    def _table(self, header: bool) -> Table:
        """Every chunk has the same columns, widths and box, so chunks line up under the first header;
        the details column gets the rest of the line (rich would squeeze the fixed ones otherwise)."""
        table = Table(
            box=box.SIMPLE_HEAD, show_header=header, show_edge=False, pad_edge=False, collapse_padding=True
        )
        for name, width, justify in COLUMNS:
            table.add_column(name, width=width, no_wrap=True, overflow="ellipsis", justify=justify)
        rest = max(16, self._console.width - sum(width for _, width, _ in COLUMNS) - GAP * len(COLUMNS))
        table.add_column("details", max_width=rest, no_wrap=True, overflow="ellipsis")
        return table

    def _status(self) -> Text:
        if not self._shown:
            return Text("following: nothing shown yet (Ctrl-C stops)", style="dim")
        age = time.monotonic() - self._last_shown
        return Text(f"following: {self._shown} shown, the last {age:.0f} s ago (Ctrl-C stops)", style="dim")

    def add(self, entry: Entry) -> None:
        self._pending.append(entry)
        if len(self._pending) >= CHUNK_ROWS:
            self._flush()

    def tick(self) -> None:
        self._flush()
        if self._use_live:
            self._live.update(self._status(), refresh=True)

    def _flush(self) -> None:
        if not self._pending:
            return
        table = self._table(header=self._shown == 0)
        for entry in self._pending:
            table.add_row(*(Text(cell) for cell in row(entry)))  # Text: no markup in payload strings
        self._shown += len(self._pending)
        self._last_shown = time.monotonic()
        self._pending.clear()
        self._console.print(table)

    def close(self) -> None:
        self._flush()
        if self._use_live:
            self._live.stop()


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_tables(summary: Summary) -> Group:
    """One table per grouping that has keys: messages, bytes, rates, size percentiles, time span."""
    tables = []
    for grouping in GROUPINGS:
        rows = summary.rows(grouping)
        if not rows:
            continue
        table = Table(title=f"by {grouping.replace('dlq_reason', 'dead-letter reason')}", box=box.SIMPLE_HEAD)
        table.add_column(grouping, no_wrap=True)
        for name in ("messages", "bytes", "msg/s", "bytes/s", *SIZE_COLUMNS, "first", "last"):
            table.add_column(name, justify="right", no_wrap=True)
        for key, tally in rows:
            table.add_row(Text(_label(grouping, key)), *_cells(tally))
        tables.append(table)
    footer = f"{summary.messages} messages, {summary.undecodable} undecodable"
    return Group(*tables, Text(footer))


def _label(grouping: str, key: str) -> str:
    if grouping == "topic":
        return topic_label(key)
    return key or "-"


def _cells(tally: Tally) -> list[str]:
    data = tally.as_dict()
    return [
        str(tally.count),
        str(tally.bytes),
        _rate(data["rate_per_s"]),
        _rate(data["bytes_per_s"]),
        *(f"{data[f'size_p{p}']:.0f}" for p in PERCENTILES),
        str(data["size_max"]),
        format_time(tally.first_ms or 0),
        format_time(tally.last_ms or 0),
    ]


class SummaryView:
    """Collects a Summary; redraws it live when following in a terminal, prints it once at close."""

    REFRESH_S: Final = 1.0

    def __init__(self, console: Console, follow: bool, as_json: bool, extra: dict[str, Any]) -> None:
        self.summary = Summary()
        self._console = console
        self._as_json = as_json
        self.extra = extra
        self._use_live = follow and console.is_terminal and not as_json
        self._live = Live(summary_tables(self.summary), console=console, auto_refresh=False)
        self._drawn = 0.0
        if self._use_live:
            self._live.start()

    def add(self, entry: Entry) -> None:
        self.summary.add(entry)

    def tick(self) -> None:
        if self._use_live and time.monotonic() - self._drawn >= self.REFRESH_S:
            self._live.update(summary_tables(self.summary), refresh=True)
            self._drawn = time.monotonic()

    def close(self) -> None:
        if self._use_live:
            self._live.update(summary_tables(self.summary), refresh=True)
            self._live.stop()
        elif self._as_json:
            self._console.file.write(json.dumps(self.summary.as_dict() | self.extra) + "\n")
            self._console.file.flush()
        else:
            self._console.print(summary_tables(self.summary))
