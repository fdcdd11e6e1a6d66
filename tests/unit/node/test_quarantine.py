from __future__ import annotations

from pathlib import Path

from sapo import storage
from sapo.node.quarantine import RECORD, Attempt, AttemptLog, is_poison, next_attempt


def test_attempts_count_per_batch_and_replays_leave_the_record_alone() -> None:
    first = next_attempt(None, "n/5", 5)
    assert first == Attempt("n/5", 5, 1)
    failed = Attempt("n/5", 5, 1, "IndexError: x")
    assert next_attempt(failed, "n/5", 5) == Attempt("n/5", 5, 2, "IndexError: x")
    assert next_attempt(failed, "n/3", 3) is None  # replayed after a restart: stepped past before
    assert next_attempt(failed, "n/6", 6) == Attempt("n/6", 6, 1)  # n/5 succeeded
    assert next_attempt(failed, "m/5", 5) == Attempt("m/5", 5, 1)  # another batch at that sequence


def test_a_batch_is_poison_once_its_attempts_are_used_up() -> None:
    record = Attempt("n/5", 5, 3, "OutOfMemoryError")
    assert is_poison(record, "n/5", 3)
    assert not is_poison(record, "n/5", 4)
    assert not is_poison(record, "n/6", 3)
    assert not is_poison(None, "n/5", 1)


def test_the_record_survives_the_process_and_a_damaged_one_counts_as_none(tmp_path: Path) -> None:
    directory = storage.location(tmp_path / "node-a")
    log = AttemptLog(directory, "xxh3-128")
    assert log.read() is None
    log.write(Attempt("n/5", 5, 2, "x" * 5000))
    again = AttemptLog(directory, "xxh3-128").read()
    assert again is not None and (again.batch_id, again.sequence, again.attempts) == ("n/5", 5, 2)
    assert len(again.error) == 2000
    (tmp_path / "node-a" / RECORD).write_text("{not json")
    assert log.read() is None
