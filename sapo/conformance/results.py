"""The kit's verdicts: one row per check, each citing the section of docs/contract.md it enforces."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from rich import box
from rich.console import Console
from rich.table import Table


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Check:
    """One verdict. `detail` says what was observed: on a failure, what the service did instead."""

    name: str
    section: str
    status: Status
    detail: str


@dataclass
class Results:
    """The verdicts of one run against one service, in the order they were reached."""

    service: str
    node: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, section: str, ok: bool, detail: str) -> bool:
        """Record a pass or a failure; returns `ok`."""
        self.checks.append(Check(name, section, Status.PASS if ok else Status.FAIL, detail))
        return ok

    def skip(self, name: str, section: str, why: str) -> None:
        self.checks.append(Check(name, section, Status.SKIP, why))

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def passed(self) -> bool:
        """No check failed (a skipped one is not a pass of the service, and not a failure either)."""
        return not self.failed()

    def table(self) -> Table:
        title = f"sapo conformance {self.service} --node {self.node}"
        table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
        table.add_column("check", no_wrap=True)
        table.add_column("contract", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("observed", overflow="fold")
        style = {Status.PASS: "green", Status.FAIL: "bold red", Status.SKIP: "yellow"}
        for check in self.checks:
            table.add_row(
                check.name, check.section, f"[{style[check.status]}]{check.status}[/]", check.detail
            )
        return table

    def summary(self) -> str:
        counts = {s: sum(c.status is s for c in self.checks) for s in Status}
        verdict = "conformant" if self.passed else "NOT conformant"
        return (
            f"{self.service} {self.node}: {verdict} ({counts[Status.PASS]} passed, "
            f"{counts[Status.FAIL]} failed, {counts[Status.SKIP]} skipped)"
        )

    def print(self, console: Console) -> None:
        """The table and the summary, each line ending with its content: rich pads every row to the
        table's width, which one long detail widens to the console's (240 columns into a pipe)."""
        with console.capture() as capture:
            console.print(self.table())
            console.print(self.summary())
        console.file.write("".join(f"{line.rstrip()}\n" for line in capture.get().splitlines()))

    def to_json(self) -> str:
        return json.dumps({"service": self.service, "node": self.node, "passed": self.passed,
                           "checks": [asdict(c) for c in self.checks]})  # fmt: skip
