"""A Hugging Face model that is not on the machine fails at start with what to set, not with a
traceback from deep inside transformers; one that is (a directory, or the hub cache as `hf download`
leaves it) passes the check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from sapo.models import ModelUnavailableError, require_device, require_loadable, require_local
from sapo.settings import ConfigError

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
MISSING = "sapo-test/not-downloaded"


def service_env(service: str, tmp_path: Path) -> dict[str, str]:
    """A service configured with a hub id, offline, with an empty hub cache and no broker at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SAPO_", "XDG_", "TRANSFORMERS_"))}
    prefix = f"SAPO_{service.upper()}_"
    return env | {
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "SAPO_CACHE_DIR": str(tmp_path / "sapo"),
        prefix + "NODE_ID": "node-0",
        prefix + "MODEL": MISSING,
        prefix + "HTTP_PORT": "0",
        prefix + "LOG_FORMAT": "text",
        prefix + "KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",  # discard port: nothing may be reached
        "SAPO_TRAINER_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
    }


@pytest.mark.parametrize("service", ["generator", "trainer"])
def test_a_service_with_a_model_not_in_the_cache_exits_at_start_saying_what_to_set(
    service: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"services.{service}.main"],
        env=service_env(service, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert f"model {MISSING!r} is not in the Hugging Face cache {tmp_path / 'hf' / 'hub'}" in message
    assert "offline (HF_HUB_OFFLINE=1)" in message
    for what in ("models.download.enabled=true", "models.volume", f"hf download {MISSING}"):
        assert what in message, message
    assert not (tmp_path / "hf" / "hub" / ("models--" + MISSING.replace("/", "--"))).exists()


def test_a_model_in_the_hub_cache_or_a_directory_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelUnavailableError, match="not in the Hugging Face cache"):
        require_local(MISSING)
    repo = tmp_path / "hub" / ("models--" + MISSING.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)  # what `hf download` leaves
    require_local(MISSING)
    require_local(str(snapshot))
    require_loadable("tiny:1")  # the project's own models are never looked up
    require_loadable("bundled:smollm2-135m-instruct")


def test_a_missing_directory_or_a_malformed_id_is_named() -> None:
    with pytest.raises(ModelUnavailableError, match=r"'/models/absent': no such directory.*models\.volume"):
        require_local("/models/absent")
    with pytest.raises(ModelUnavailableError, match="neither a local directory nor a Hugging Face id"):
        require_local("a/b/c")


def test_a_service_names_the_variable_a_model_it_cannot_load_came_from() -> None:
    with pytest.raises(ModelUnavailableError) as error:
        require_loadable("nosuch:model", "SAPO_GENERATOR_MODEL")
    assert str(error.value).startswith("SAPO_GENERATOR_MODEL: model 'nosuch:model' is neither a local")


@pytest.mark.parametrize(
    ("ref", "said"),
    [
        ("tiny:abc", "bad tiny model reference 'tiny:abc'"),
        ("tiny-bpe:1:64", "use tiny-bpe:<seed> or tiny-bpe:<seed>:<hidden>x<layers>"),
        ("tiny:1:33x2", "not divisible"),
        ("warm:x", "bad warm model reference 'warm:x'"),
        ("bundled:nope", "the only bundled model is 'bundled:smollm2-135m-instruct'"),
    ],
)
def test_a_project_or_bundled_reference_written_wrong_is_named_before_a_load(ref: str, said: str) -> None:
    """These were never looked up, so a typo passed the services' preflight and crashed the model load
    once the lease was taken."""
    with pytest.raises(ModelUnavailableError) as error:
        require_loadable(ref, "SAPO_TRAINER_MODEL")
    assert str(error.value).startswith("SAPO_TRAINER_MODEL: ") and said in str(error.value)


def test_a_directory_that_holds_no_model_is_named(tmp_path: Path) -> None:
    """A directory was taken as a model as it stood; transformers then failed in a traceback (`Unrecognized
    model ... Should have a model_type key`) once the service held its lease."""
    with pytest.raises(ModelUnavailableError) as error:
        require_loadable(str(tmp_path), "SAPO_GENERATOR_MODEL")
    assert str(error.value).startswith(
        f"SAPO_GENERATOR_MODEL: model {str(tmp_path)!r}: the directory holds no"
    )
    (tmp_path / "config.json").write_text("{}")
    require_loadable(str(tmp_path), "SAPO_GENERATOR_MODEL")


def test_a_device_this_machine_lacks_is_named_before_a_model_moves_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch said so only when the model moved there (`Torch not compiled with CUDA enabled`), after
    the lease, in a traceback."""
    import torch

    require_device("cpu", "SAPO_TRAINER_DEVICE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^SAPO_TRAINER_DEVICE=cuda: .*set SAPO_TRAINER_DEVICE=cpu"):
        require_device("cuda", "SAPO_TRAINER_DEVICE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    require_device("cuda", "SAPO_TRAINER_DEVICE")
    require_device("cuda:1", "SAPO_TRAINER_DEVICE")
    with pytest.raises(
        ConfigError, match=r"^SAPO_TRAINER_DEVICE=cuda:2: 2 CUDA device\(s\) visible \(cuda:0..cuda:1\)"
    ):
        require_device("cuda:2", "SAPO_TRAINER_DEVICE")
