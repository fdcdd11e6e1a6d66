"""`sapo report`: contributions added up per (training node, source node) from a run's step rows."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sapo.cli import main
from sapo.swarm.history import STEPS_DIR, append_row, read_rows, step_row
from sapo.swarm.report import contribution_totals, intake_totals, plot, print_intake, print_table
from sapo.v1 import batch_pb2, policy_pb2

pytestmark = pytest.mark.unit


def _metrics(
    *contributions: tuple[str, int, int, int, float], intake: tuple[batch_pb2.PeerIntake, ...] = ()
) -> policy_pb2.StepMetrics:
    m = policy_pb2.StepMetrics(intake=intake)
    for node, groups, completions, tokens, mass in contributions:
        m.contributions.add(
            node_id=node,
            groups=groups,
            completions=completions,
            completion_tokens=tokens,
            advantage_mass=mass,
        )
    return m


def _intake(peer: str, received: int, used: int, **rejected: int) -> batch_pb2.PeerIntake:
    return batch_pb2.PeerIntake(node_id=peer, received=received, used=used, rejected=rejected)


def _record(run_dir: Path) -> None:
    steps = run_dir / STEPS_DIR
    rows = [
        ("node-a", _metrics(("node-a", 2, 8, 60, 4.0), ("node-b", 1, 4, 40, 2.0))),
        ("node-a", _metrics(("node-a", 1, 4, 20, 2.0), ("node-c", 1, 4, 30, 4.0), ("node-b", 1, 2, 10, 0.0))),
        (
            "node-a",
            _metrics(intake=(_intake("node-b", 3, 1, no_signal=2), _intake("node-c", 1, 0, expired=1))),
        ),
        ("node-a", _metrics(intake=(_intake("node-b", 2, 1, no_signal=1, unused=1),))),  # an empty round
        ("node-b", _metrics(("node-b", 2, 8, 50, 3.0))),
    ]
    for version, (node, m) in enumerate(rows, start=1):
        append_row(steps / f"{node}.jsonl", step_row(node, version, f"{node}/{version}", m, 0.0))


def test_step_rows_record_the_contributions_and_the_intake() -> None:
    m = _metrics(("node-b", 1, 4, 40, 2.5), intake=(_intake("node-b", 3, 1, no_signal=2),))
    m.step_seconds, m.step_cpu_seconds = 2.5, 1.25
    row = step_row("node-a", 1, "node-a/0", m, 0.0)
    assert (row["step_seconds"], row["step_cpu_seconds"]) == (2.5, 1.25)
    assert row["contributions"] == [
        {"node": "node-b", "groups": 1, "completions": 4, "completion_tokens": 40, "advantage_mass": 2.5}
    ]
    assert row["intake"] == [{"node": "node-b", "received": 3, "used": 1, "rejected": {"no_signal": 2}}]


def test_totals_per_trainer_and_source_with_shares(tmp_path: Path) -> None:
    _record(tmp_path)

    totals = contribution_totals(tmp_path)

    keys = [(t.trainer, t.source) for t in totals]
    assert keys == [("node-a", "node-a"), ("node-a", "node-c"), ("node-a", "node-b"), ("node-b", "node-b")]
    own, c, b, other = totals
    assert (own.steps, own.groups, own.completions, own.completion_tokens) == (2, 3, 12, 80)
    assert own.advantage_mass == pytest.approx(6.0) and own.local
    assert (b.steps, b.groups, b.completion_tokens) == (2, 2, 50)
    assert own.token_share == pytest.approx(80 / 160) and c.mass_share == pytest.approx(4 / 12)
    assert (other.token_share, other.mass_share) == (1.0, 1.0)


def test_intake_totals_per_node_and_peer(tmp_path: Path) -> None:
    _record(tmp_path)

    totals = intake_totals(tmp_path)

    assert [(t.node, t.peer, t.received, t.used) for t in totals] == [
        ("node-a", "node-b", 5, 2),
        ("node-a", "node-c", 1, 0),
    ]
    assert totals[0].rejected == {"no_signal": 3, "unused": 1}
    out = io.StringIO()
    print_intake(totals, out)
    assert "no_signal 3, unused 1" in out.getvalue()


def test_table_and_plot(tmp_path: Path) -> None:
    _record(tmp_path)
    totals = contribution_totals(tmp_path)
    out = io.StringIO()
    print_table(totals, out)
    text = out.getvalue()
    assert "node-a (own)" in text and "node-c" in text and "33.3%" in text
    plot(totals, tmp_path / "contributions.png")
    assert (tmp_path / "contributions.png").read_bytes()[:4] == b"\x89PNG"


def test_rows_from_before_contributions_were_recorded_count_nothing(tmp_path: Path) -> None:
    row = step_row("node-a", 1, "node-a/0", _metrics(), 0.0)
    del row["contributions"]
    append_row(tmp_path / STEPS_DIR / "node-a.jsonl", row)
    assert read_rows(tmp_path / STEPS_DIR / "node-a.jsonl")
    assert contribution_totals(tmp_path) == []


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{"version": 1}\ngarbage\n', "node-a.jsonl line 2: not JSON"),
        (b"\xff\n", "node-a.jsonl: not UTF-8 text"),
        (b"[]\n", "node-a.jsonl line 1: not a JSON object"),
        (b'{"contributions": 5}\n', "TypeError"),
    ],
)
def test_a_damaged_step_record_is_named_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, said: str
) -> None:
    """`sapo report` ended in a JSONDecodeError, UnicodeDecodeError, AttributeError or TypeError
    traceback on a step record it did not expect."""
    (tmp_path / STEPS_DIR).mkdir()
    (tmp_path / STEPS_DIR / "node-a.jsonl").write_bytes(content)
    assert main(["report", str(tmp_path), "--no-plot"]) == 1
    assert "a step record is not what `sapo swarm` writes" in caplog.text and said in caplog.text
