"""The library's layering: no import circles, no module importing a layer above its own, and every
function-local import of a project module known here with its reason (they hide circles otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

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
