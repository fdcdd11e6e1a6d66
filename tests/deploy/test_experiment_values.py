"""`sapo experiment --plan-only` writes one Helm values file per node: each renders with the chart,
and every setting it sets is a real setting of its service, with the values the local swarm uses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sapo.experiment.plan import load_scenario
from sapo.experiment.runner import write_plan
from sapo.swarm.manifest import SETTINGS, Service
from tests.deploy.helm import SERVICES, container, deployment, env_of, render

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def paper_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan")
    write_plan(load_scenario("paper"), out)
    return out


def test_plan_has_a_manifest_per_run_and_values_per_node(paper_plan: Path) -> None:
    scenario = load_scenario("paper")
    runs = sorted(p.name for p in (paper_plan / "helm").iterdir())
    assert len(runs) == len(scenario.configs) * len(scenario.seeds)
    assert sorted(p.stem for p in (paper_plan / "manifests").iterdir()) == runs
    for run in runs:
        assert len(list((paper_plan / "helm" / run).glob("node-*.yaml"))) == scenario.groups[0].count


@pytest.mark.parametrize("service", SERVICES)
def test_node_values_render_and_every_setting_is_accepted(
    paper_plan: Path, service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = paper_plan / "helm" / "i6-j2-s1" / "node-3.yaml"
    data = yaml.safe_load(values.read_text())
    assert data["topicPrefix"] == "sapo-i6-j2-s1"  # runs of one experiment never share topics
    dep = deployment(render(values), service)
    prefix = f"SAPO_{service.upper()}_"
    env = {v["name"].removeprefix(prefix): v.get("value", "from-secret") for v in env_of(dep)}
    if service == "sampler":
        assert (env["LOCAL_GROUPS"], env["EXTERNAL_GROUPS"], env["EXPECTED_PEERS"]) == ("6", "2", "7")
    if service == "generator":
        assert env["MODEL"] == "Qwen/Qwen2.5-0.5B-Instruct"
        assert env["BACKEND"] == "vllm"
    if service == "trainer":
        assert env["CHECKPOINT_ROOT"] == "/var/lib/sapo/checkpoints"  # the chart's volume, not a local path
        assert env["DEVICE"] == "cuda"
    if service != "sampler":
        # GPU settings only ever with the GPU image and a GPU; the hub model is fetched before start.
        assert "sapo-swarm-gpu" in container(dep)["image"]
        assert "nvidia.com/gpu" in container(dep)["resources"]["limits"]
        (init,) = dep["spec"]["template"]["spec"]["initContainers"]
        assert init["args"][:3] == ["hf", "download", "Qwen/Qwen2.5-0.5B-Instruct"]
        assert env["HF_HUB_OFFLINE"] == "1"
    else:
        assert "sapo-swarm-gpu" not in container(dep)["image"]
    for name in [n for n in os.environ if n.startswith("SAPO_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(prefix + name, value)
    SETTINGS[service]()  # raises ValidationError naming a bad variable
