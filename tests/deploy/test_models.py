"""A Hugging Face model reaches the pods: the chart's init container (`hf download` into the cache
volume) and the services' loader, run with exactly the environment the chart renders.

No hub is reachable here, so the test lays out the hub cache the way `hf download` leaves it (a tiny
model built by the project, saved under hub/models--<org>--<name>/snapshots/<commit>, refs/main) and
then runs, offline: the init container's own command (which must find the snapshot, not download),
and the services' `load_model` for the model id. With an empty cache both fail instead of downloading.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.helm import CHART, ROOT, deployment, render

pytestmark = pytest.mark.unit
MODEL_ID = "sapo-test/tiny-policy"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def rendered(cache: Path) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(init container args, its env, the trainer's env) for `model=MODEL_ID` with models.download."""
    docs = render(
        CHART / "ci/gpu-node-values.yaml",
        f"model={MODEL_ID}",
        f"cache.mountPath={cache}",
    )
    dep = deployment(docs, "trainer")
    spec = dep["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    init_env = {v["name"]: v["value"] for v in init["env"] if "value" in v}
    (container,) = spec["containers"]
    env = {v["name"]: v["value"] for v in container["env"] if "value" in v}
    return init["args"], init_env, env


def fill_hub_cache(hf_home: Path) -> Path:
    """A tiny model where `hf download MODEL_ID --revision main` would have put it."""
    from sapo.models.bpe import load_bpe_tokenizer
    from sapo.models.tiny import build_tiny_model

    repo = hf_home / "hub" / ("models--" + MODEL_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    tokenizer = load_bpe_tokenizer()
    build_tiny_model(tokenizer, seed=3).save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SAPO_", "XDG_", "TRANSFORMERS_"))
    }
    base |= {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, env=base | env, capture_output=True, text=True, timeout=300, check=False)


LOAD = "from sapo.models.loading import load_model; m, t = load_model({!r}); print(type(m).__name__)"


def test_downloaded_model_loads_offline_with_the_rendered_environment(tmp_path: Path) -> None:
    init_args, init_env, env = rendered(tmp_path / "cache")
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == init_env["HF_HOME"] == str(tmp_path / "cache" / "huggingface")
    snapshot = fill_hub_cache(Path(env["HF_HOME"]))

    # The init container's command, offline: it resolves the cached snapshot instead of downloading.
    hf = Path(sys.executable).with_name(init_args[0])
    fetched = run([str(hf), *init_args[1:]], init_env | {"HF_HUB_OFFLINE": "1"})
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.strip().endswith(str(snapshot)), fetched.stdout

    loaded = run([sys.executable, "-c", LOAD.format(MODEL_ID)], env)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("LlamaForCausalLM"), loaded.stdout


def test_missing_model_fails_at_start_without_downloading(tmp_path: Path) -> None:
    _, _, env = rendered(tmp_path / "cache")
    loaded = run([sys.executable, "-c", LOAD.format(MODEL_ID)], env)
    assert loaded.returncode != 0
    assert "offline" in loaded.stderr  # HF_HUB_OFFLINE=1: no download was attempted
    assert not (
        tmp_path / "cache" / "huggingface" / "hub" / ("models--" + MODEL_ID.replace("/", "--"))
    ).exists()
