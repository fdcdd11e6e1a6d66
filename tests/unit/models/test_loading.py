"""Model loading: the atomic, process-safe cache and loading by local path (no hub, no bundled weights)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.models import build_tiny_model, cache_root, load_model
from sapo.models.cache import materialize_dir

pytestmark = pytest.mark.unit


def slow_build(target: Path) -> None:
    """A builder that takes long enough for concurrent callers to overlap, and logs each build."""
    with (target.parent / "builds.log").open("a") as log:
        log.write("build\n")
    time.sleep(0.3)
    (target / "payload.txt").write_text("complete")


def materialize_in_child(final: str) -> None:
    materialize_dir(Path(final), slow_build)
    assert (Path(final) / "payload.txt").read_text() == "complete"


def test_concurrent_first_use_by_several_processes_builds_once(tmp_path: Path) -> None:
    final = tmp_path / "entry"
    context = multiprocessing.get_context("fork")  # children only touch files
    children = [context.Process(target=materialize_in_child, args=(str(final),)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=30)
    assert [c.exitcode for c in children] == [0, 0, 0, 0]
    assert (tmp_path / "builds.log").read_text() == "build\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["builds.log", "entry", "entry.lock"]


def test_failed_build_leaves_no_entry_and_no_temp_dir(tmp_path: Path) -> None:
    def broken(target: Path) -> None:
        (target / "half.txt").write_text("half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        materialize_dir(tmp_path / "entry", broken)
    assert [p.name for p in tmp_path.iterdir()] == ["entry.lock"]


def test_losing_the_rename_race_uses_the_winners_copy(tmp_path: Path) -> None:
    """Where the lock is not honoured, another process may finish first: its copy wins, ours is dropped."""
    final = tmp_path / "entry"

    def racing(target: Path) -> None:
        (target / "payload.txt").write_text("mine")
        final.mkdir()
        (final / "payload.txt").write_text("winner")

    assert materialize_dir(final, racing) == final
    assert (final / "payload.txt").read_text() == "winner"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry", "entry.lock"]


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("SAPO_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "sapo-swarm"


def test_local_path_loads_offline(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    build_tiny_model(tokenizer, seed=3).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    model, loaded_tokenizer = load_model(str(tmp_path), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and not model.training
    expected = build_tiny_model(tokenizer, seed=3).state_dict()["model.norm.weight"]
    torch.testing.assert_close(model.state_dict()["model.norm.weight"].float(), expected)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()


def test_unknown_references_fail_fast(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only bundled model"):
        load_model("bundled:llama-70b")
    with pytest.raises(OSError):  # not a directory and no download allowed
        load_model(str(tmp_path / "does-not-exist"))
