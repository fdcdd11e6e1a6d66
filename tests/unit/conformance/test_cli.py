"""`sapo conformance` arguments: a bad value names the flag that gave it, and `--timeout` bounds the
kit's metadata requests too; its table fits its content. No broker: the kit's topic reader is a fake
that records its timeout, or the kit itself a stub that returns verdicts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import pytest

from sapo.cli import main
from sapo.conformance import cli as conformance_cli
from sapo.conformance import observe
from sapo.conformance.common import GeneratorTarget, Target
from sapo.conformance.results import Results
from sapo.inspect.reader import InspectError

pytestmark = pytest.mark.unit
KIT = ["conformance", "sampler", "--node", "node-0", "--bootstrap", "127.0.0.1:1"]


def test_a_value_out_of_bounds_names_the_flag_and_the_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert main([*KIT, "--timeout", "5000", "--quiet", "601"]) == 2
    assert "--timeout: Input should be less than or equal to 3600 (got 5000.0)" in caplog.text
    assert "--quiet: Input should be less than or equal to 600 (got 601.0)" in caplog.text
    assert "SAPO_CONFORMANCE_TIMEOUT_S" not in caplog.text
    caplog.clear()
    monkeypatch.setenv("SAPO_CONFORMANCE_TIMEOUT_S", "5000")  # what the environment gave, it names
    assert main(KIT) == 2
    assert "SAPO_CONFORMANCE_TIMEOUT_S: Input should be less than or equal to 3600" in caplog.text


@pytest.mark.parametrize(
    ("flags", "waited"), [(["--timeout", "3"], 3.0), ([], 10.0), (["--timeout", "60"], 10.0)]
)
def test_metadata_requests_wait_no_longer_than_the_timeout(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], waited: float
) -> None:
    asked: list[float] = []

    def unreachable(config: Mapping[str, str], timeout_s: float) -> NoReturn:
        """The kit's topic reader as it finds no broker: it remembers how long it was told to wait."""
        asked.append(timeout_s)
        raise InspectError("no broker")

    monkeypatch.setattr(observe, "TopicReader", unreachable)
    assert main([*KIT, *flags]) == 1
    assert asked == [waited]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "pass --model and --checkpoint-root"),
        (["--model", "tiny:x", "--checkpoint-root", "{tmp}"], "--model: bad tiny model reference 'tiny:x'"),
        (
            ["--model", "tiny:1", "--checkpoint-root", "nosuch://b/c"],
            "--checkpoint-root nosuch://b/c: Protocol",
        ),
        (
            ["--model", "tiny:1", "--checkpoint-root", "{tmp}/file/ckpt"],
            "--checkpoint-root {tmp}/file/ckpt: cannot",
        ),
    ],
)
def test_the_generator_kit_s_flags_are_usage_errors_before_it_starts(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, flags: list[str], said: str
) -> None:
    """A store it cannot use ended the kit in a traceback once it had started (and loaded torch)."""
    caplog.set_level(logging.INFO)
    (tmp_path / "file").write_text("")
    kit = ["conformance", "generator", "--node", "node-0", "--bootstrap", "127.0.0.1:1"]
    assert main([*kit, *(f.format(tmp=tmp_path) for f in flags)]) == 2
    assert said.format(tmp=tmp_path) in caplog.text
    assert "driving the generator" not in caplog.text


def test_the_table_into_a_pipe_ends_each_line_with_its_content(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One long detail widens the table to the whole pipe width (240 columns); rich padded every other
    row to it."""

    def verdicts(target: Target, generator_target: GeneratorTarget | None = None) -> Results:
        results = Results(target.service, target.node)
        results.add("refuses what it must", "§8.2", True, "12 reasons")
        results.add("commits only finished input", "§5.3", False, "group g was pooled " * 30)
        return results

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(conformance_cli, "run_kit", verdicts)
    assert main(KIT) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line != line.rstrip()] == []
    assert max(map(len, lines)) > 200  # the long detail is there, folded to the pipe's width
    [row] = [line for line in lines if "refuses what it must" in line]
    assert row.endswith("12 reasons")
