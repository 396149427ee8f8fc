"""The house's import graph, read from the source with ``ast`` (nothing is imported): no
circle of modules, and serving code never reaches into the simulator.

Every import counts — at module level, inside a function, or under ``TYPE_CHECKING`` — since
a lazy import is still a dependency, only one that an import-time check cannot see."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentflow", "pipelines")
# What may use agentflow.sim: the simulator itself, and the tools that drive it — the CLI
# (``agentflow simulate``), the eval harness (its simulated mode and arrival times) and the
# benchmarks. Everything else is serving code.
SIM_USERS = ("agentflow/sim/", "agentflow/cli/", "agentflow/evaluation/", "agentflow/bench/")


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(tree: ast.Module, module: str, is_package: bool,
              modules: dict[str, Path]) -> set[str]:
    """Project modules that ``module``'s source imports, anywhere in the file."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import sub`` imports the submodule when there is one
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # ``import a.b.c`` of a name inside a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


@functools.cache
def import_graph() -> nx.DiGraph:
    modules = _module_files()
    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in _imported(tree, module, path.name == "__init__.py", modules):
            graph.add_edge(module, target)
    return graph


def test_the_graph_reads_the_imports_it_should():
    graph = import_graph()
    assert graph.number_of_nodes() > 200
    assert graph.has_edge("agentflow.sim.engine", "agentflow.llm.llama_batches")
    assert graph.has_edge("agentflow.server.service", "agentflow.server.prometheus")
    # lazy (inside a function) and TYPE_CHECKING imports count
    assert graph.has_edge("agentflow.sql.database", "agentflow.sql.postgres")
    assert graph.has_edge("agentflow.scheduler.setup", "agentflow.config")


def test_no_module_circle():
    """A circle means no module of it can be read, tested or moved without the others;
    constants and small types belong to the lowest module that needs them."""
    circles = sorted(sorted(c) for c in nx.strongly_connected_components(import_graph())
                     if len(c) > 1)
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_serving_never_imports_the_simulator():
    """What serving and the simulator share (llama.cpp's slot rule, the step-time model,
    the scheduler) lives below both; serving code imports no ``agentflow.sim`` module, lazily
    or not."""
    modules = _module_files()
    graph = import_graph()
    offenders = sorted(
        f"{m} -> {t}" for m, t in graph.edges
        if (t == "agentflow.sim" or t.startswith("agentflow.sim."))
        and not str(modules[m].relative_to(ROOT)).startswith(SIM_USERS))
    assert offenders == []


def test_only_the_bench_command_imports_the_benchmarks():
    """Benchmarks sit on top of the house: a product command that needs what a benchmark
    measures (``agentflow calibrate`` and real_vs_sim's calibration grid) gets it from a
    module below both, so no product module depends on a benchmark script."""
    graph = import_graph()
    users = sorted(f"{a} -> {b}" for a, b in graph.edges
                   if b.startswith("agentflow.bench") and not a.startswith("agentflow.bench")
                   and a != "agentflow.cli.bench")
    assert users == []
