"""The library's layering: no import circles, no module importing a layer above its own, and every
function-local import of a project module known here with its reason (they hide circles otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script
from tests.services import start_service

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

LOCAL_IMPORTS = {
    ("sapo.cli", "sapo.experiment.plan"): "start-up time: the CLI's light commands never load torch",
    ("sapo.cli", "sapo.experiment.results"): "start-up time",
    ("sapo.cli", "sapo.experiment.runner"): "start-up time",
    ("sapo.cli", "sapo.swarm.manifest"): "start-up time",
    ("sapo.cli", "sapo.swarm.run"): "start-up time",
    ("sapo.swarm.run", "sapo.swarm.inprocess"): "the services' launcher never loads torch or models",
    ("sapo.conformance.cli", "sapo.conformance.generator"): "start-up time: `sapo --help` never loads torch",
    ("sapo.conformance.cli", "sapo.conformance.sampler"): "start-up time",
    ("sapo.conformance.cli", "sapo.conformance.trainer"): "start-up time",
    ("sapo.node.metrics", "sapo.trainer"): "the sampler imports the module and never loads torch",
    ("sapo.node.metrics", "sapo.trainer.contributions"): "the same (`contributions` is also a module)",
    ("services.generator.main", "sapo.node.generator"): "start-up time: bad settings fail before torch loads",
    ("services.trainer.main", "sapo.node.trainer"): "start-up time: bad settings fail before torch loads",
}


def test_no_circles_no_upward_imports_and_only_known_local_imports() -> None:
    graph_module = load_script("import_graph")
    graph = graph_module.build_graph(ROOT)
    assert graph.circles() == []
    assert graph.upward() == []
    assert set(graph.local) == set(LOCAL_IMPORTS)


def test_every_module_has_a_layer_and_the_library_never_imports_the_entrypoints() -> None:
    graph_module = load_script("import_graph")
    graph = graph_module.build_graph(ROOT)
    for module in graph.modules:
        graph_module.layer_of(module)  # raises for a module in no layer
    assert not [(a, b) for a, b in graph.edges if a.startswith("sapo") and b.startswith("services")]


def test_the_sampler_service_loads_neither_torch_nor_transformers() -> None:
    """A sampler runs no model: importing them would cost it seconds of start-up and ~300 MB."""
    probe = "import sys, services.sampler.main; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_generator_and_trainer_settings_load_neither_torch_nor_transformers() -> None:
    """Their settings are checked before the service is imported: bad ones must fail without the seconds
    torch and transformers take to import (the packages' heavy names load on first use, `sapo.lazy`)."""
    settings = ("sapo.generator.settings", "sapo.trainer.settings", "sapo.models.settings")
    modules = ", ".join([*settings, "services.generator.main", "services.trainer.main"])
    probe = f"import sys, {modules}; print(sorted({{'torch', 'transformers'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("service", "field"), [("generator", "MAX_NEW_TOKENS"), ("trainer", "LR")])
def test_a_service_with_bad_settings_exits_saying_what_to_set_before_loading_torch(
    service: str, field: str
) -> None:
    prefix = f"SAPO_{service.upper()}_"
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefix)}
    env |= {f"{prefix}NODE_ID": "node-a", f"{prefix}{field}": "-1"}
    # What the process holds when it exits: atexit runs after the settings error ended `main`.
    probe = (
        "import atexit, runpy, sys; "
        "atexit.register(lambda: print(sorted({'torch', 'transformers'} & set(sys.modules)))); "
        f"runpy.run_module('services.{service}.main', run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 1, out.stderr
    assert f"  {prefix}{field}: Input should be greater" in out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("service", "value", "reason"),
    [
        ("sampler", "localhost:99999", "the port '99999' is not a number from 1 to 65535"),
        ("sampler", "", "it names no broker"),
        ("generator", "broker:", "the port '' is not a number from 1 to 65535"),
        ("trainer", "kafka://broker:9092", "the scheme kafka:// is none of"),
    ],
)
def test_a_service_with_a_malformed_broker_list_exits_naming_its_variable(
    service: str, value: str, reason: str
) -> None:
    """At start, before the ops server, any client or torch: librdkafka would take port 99999 as 34463
    and retry forever. (A name that does not resolve yet is no error for a service.)"""
    prefix = f"SAPO_{service.upper()}_"
    variable = f"{prefix}KAFKA__BOOTSTRAP_SERVERS"
    out = start_service(service, {f"{prefix}NODE_ID": "node-a", variable: value})
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == f"invalid configuration for {service.capitalize()}Settings:", out.stderr
    assert lines[1].startswith(f"  {variable}: Value error, must name the brokers as HOST:PORT"), out.stderr
    assert reason in lines[1] and lines[1].endswith(f"(got {value!r})")
