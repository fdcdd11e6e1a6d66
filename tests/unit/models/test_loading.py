"""Model loading: the atomic, process-safe cache and loading by local path (no hub, no bundled weights)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from sapo.models import build_tiny_model, cache_root, load_model
from sapo.models.cache import materialize_dir
from sapo.models.hub import ModelUnavailableError

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
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "sapo"))
    assert cache_root() == tmp_path / "sapo"  # SAPO_CACHE_DIR wins
    monkeypatch.delenv("SAPO_CACHE_DIR")
    assert cache_root() == tmp_path / "xdg" / "sapo-swarm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "sapo-swarm"


def test_a_read_only_home_builds_models_under_xdg_cache_home(tmp_path: Path) -> None:
    """What the images do: HOME is not writable, XDG_CACHE_HOME points at a volume. A cached build (the
    BPE tokenizer) in a fresh process lands under XDG_CACHE_HOME, not in ~/.cache; without
    XDG_CACHE_HOME it fails on the read-only HOME (checked unless root, who writes through the bits)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAPO_", "XDG_"))}
    env |= {"HOME": str(home), "PYTHONPATH": str(Path(__file__).parents[3]), "OMP_NUM_THREADS": "1"}

    def build(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        script = "from sapo.models import bpe_tokenizer_dir; print(bpe_tokenizer_dir())"
        command = [sys.executable, "-c", script]
        return subprocess.run(
            command, env=env | extra, capture_output=True, text=True, timeout=300, check=False
        )

    home.chmod(0o555)
    try:
        if os.geteuid() != 0:
            refused = build({})
            assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr
        built = build({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    finally:
        home.chmod(0o755)
    assert built.returncode == 0, built.stderr
    directory = Path(built.stdout.strip())
    assert directory.is_relative_to(tmp_path / "xdg" / "sapo-swarm"), directory
    assert any(directory.iterdir())
    assert not (home / ".cache").exists()


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
    with pytest.raises(ModelUnavailableError, match="no such directory"):  # and no download allowed
        load_model(str(tmp_path / "does-not-exist"))
