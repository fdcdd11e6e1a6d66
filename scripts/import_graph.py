"""The project's import graph: layers, circles and imports that reach up a layer.

    python scripts/import_graph.py          # summary: modules, circles, upward imports, local imports
    python scripts/import_graph.py --dot    # the package-level graph in Graphviz dot

`LAYERS` lists the layers lowest first; a module may import its own layer or a lower one, never a higher
one, and the module graph has no circles. Function-local imports count like top-level ones (they only
hide a circle) and are listed, because each needs a reason (start-up time) where it is written.
`tests/unit/test_layers.py` asserts what the summary prints.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sapo", "services")

LAYERS: tuple[tuple[str, ...], ...] = (
    ("sapo.v1",),
    (
        "sapo.wire",
        "sapo.clientlog",
        "sapo.cliargs",
        "sapo.topics",
        "sapo.lifecycle",
        "sapo.identity",
        "sapo.settings",
        "sapo.kafkaargs",
        "sapo.malloc",
        "sapo.cpuslice",
        "sapo.cpugate",
        "sapo.lazy",
    ),
    ("sapo.digests", "sapo.tensorfile", "sapo.storage"),
    ("sapo.tasks", "sapo.convert", "sapo.grpo", "sapo.kafka", "sapo.ops", "sapo.checkpoints", "sapo.broker"),
    ("sapo.models", "sapo.runtime"),
    ("sapo.backends",),
    ("sapo.generator", "sapo.sampler", "sapo.trainer"),
    ("sapo.node",),
    ("sapo.swarm", "sapo.inspect", "sapo.conformance"),
    ("sapo.experiment",),
    ("sapo.cli",),
    ("services",),
)
"""Lowest first. `sapo` itself (the package's `__init__`) sits below everything: it imports nothing."""


def layer_of(module: str) -> int:
    """Index of the module's layer in LAYERS; -1 for `sapo` itself."""
    if module == "sapo":
        return -1
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise ValueError(f"{module} is in no layer: add it to LAYERS in scripts/import_graph.py")


@dataclass
class ImportGraph:
    modules: set[str] = field(default_factory=set)
    edges: set[tuple[str, str]] = field(default_factory=set)
    local: set[tuple[str, str]] = field(default_factory=set)
    """Edges made by imports inside a function (deferred at run time)."""

    def circles(self) -> list[set[str]]:
        """Strongly connected sets of more than one module (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[set[str]] = []
        succ: dict[str, list[str]] = {m: [] for m in self.modules}
        for a, b in self.edges:
            succ[a].append(b)

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in succ[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(component)

        for module in sorted(self.modules):
            if module not in index:
                visit(module)
        return found

    def upward(self) -> list[tuple[str, str]]:
        return sorted((a, b) for a, b in self.edges if layer_of(b) > layer_of(a))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, bool]]:
    """(imported module, inside a function) for every import of the project's own modules."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    nested = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".") if is_package else module.split(".")[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES:
                yield name, id(node) in nested


def build_graph(root: Path = ROOT) -> ImportGraph:
    graph = ImportGraph()
    files = [p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if not p.name.endswith("_pb2.py")]
    for path in files:
        graph.modules.add(_module_name(path))
    for path in files:
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for imported, local in _imports(tree, module, path.name == "__init__.py"):
            # `from pkg import name` names a module or an attribute: keep the longest module it names.
            name = imported
            while name not in graph.modules and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in graph.modules and name != module and not module.startswith(name + "."):
                graph.edges.add((module, name))
                if local:
                    graph.local.add((module, name))
    return graph


def summary(graph: ImportGraph) -> str:
    lines = [f"modules: {len(graph.modules)}, import edges: {len(graph.edges)}"]
    circles = graph.circles()
    lines.append(f"circles: {len(circles)}")
    lines += ["  " + " <-> ".join(sorted(c)) for c in circles]
    upward = graph.upward()
    lines.append(f"upward imports: {len(upward)}")
    lines += [f"  {a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in upward]
    lines.append(f"function-local imports of project modules: {len(graph.local)}")
    lines += [f"  {a} -> {b}" for a, b in sorted(graph.local)]
    return "\n".join(lines)


def dot(graph: ImportGraph) -> str:
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges = sorted({(package(a), package(b)) for a, b in graph.edges if package(a) != package(b)})
    body = "\n".join(f'  "{a}" -> "{b}";' for a, b in edges)
    return f"digraph imports {{\n  rankdir=BT;\n{body}\n}}"


def main() -> int:
    parser = argparse.ArgumentParser(description="The project's import graph.")
    parser.add_argument("--dot", action="store_true", help="print the package graph in dot")
    args = parser.parse_args()
    graph = build_graph()
    print(dot(graph) if args.dot else summary(graph))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
