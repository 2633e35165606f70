"""Imports point down only: API -> agents/tools -> orchestrator -> providers -> runtime clients -> shared values.

Read from the source with ``ast`` (TYPE_CHECKING imports included), so a new upward import or a cycle between
packages fails here before it makes the layers a tangle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit]

SOURCE = Path(__file__).resolve().parents[2] / "src" / "corral"

LAYERS = {
    "corral.testing": 9,  # test support: the conformance suite and doubles, over anything below
    "corral.cli": 8,
    "corral.mcp_server": 8,
    "corral.client": 7,  # the SDK speaks HTTP; it shares only errors and values with the server
    "corral.api": 6,
    "corral.console": 6,  # the web console's static pages and the routes serving them; mounted by the API
    "corral.agents": 5,
    "corral.tools": 4,
    "corral.orchestrator": 3,
    "corral.providers": 2,
    "corral.guest": 1,
    "corral.microvm": 1,
    "corral.images": 1,
    "corral.egress": 1,  # packet filters and the egress proxy: used by providers, uses errors only
    "corral.store": 1,
    "corral.errors": 0,
    "corral.values": 0,
    "corral.streams": 0,
    "corral.settings": 0,
    "corral.credentials": 0,
}


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        name = ".".join(parts[:end])
        if name in LAYERS:
            return name, LAYERS[name]
    raise AssertionError(f"{module} belongs to no layer; add its package to LAYERS")


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the corral modules it imports."""
    found: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        module = ".".join(("corral", *path.relative_to(SOURCE).with_suffix("").parts)).removesuffix(".__init__")
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[module] = {n for n in names if n.startswith("corral.")}
    return found


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    """Each import goes to the same layer or one below (e.g. providers never import the orchestrator)."""
    upward = []
    for module, imported in _imports().items():
        if module == "corral":
            continue
        _, level = _layer(module)
        upward += [f"{module} -> {name}" for name in sorted(imported) if _layer(name)[1] > level]
    assert upward == []


def test_packages_import_each_other_without_a_cycle() -> None:
    """No package reaches itself through others (pool and service, guest and providers, once did)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, imported in _imports().items():
        if module == "corral":
            continue
        package = _layer(module)[0]
        graph[package] |= {_layer(name)[0] for name in imported} - {package}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str], done: set[str]) -> None:
        if node in path:
            cycles.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, [*path, node], done)
        done.add(node)

    done: set[str] = set()
    for package in sorted(graph):
        visit(package, [], done)
    assert cycles == []


def test_the_orchestrator_does_not_import_its_own_modules_in_a_circle() -> None:
    """Within the orchestrator, the service uses the pools and never the other way round."""
    imports = _imports()
    assert "corral.orchestrator.service" not in imports["corral.orchestrator.pool"]
    assert "corral.orchestrator.pool" in imports["corral.orchestrator.service"]
