"""The layout of ``profiler_app`` is its architecture: each package is one layer, and a layer
imports only the layers below it. The import graph is read from the source with ``ast`` (every
import counts: a lazy one inside a function and a types-only one under ``TYPE_CHECKING``
included), so a change that climbs back up fails here with the offending import named."""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "profiler_app"

# Highest first. Packages on one line are siblings: neither imports the other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("commands",),
    ("daemon",),
    ("trial", "reports"),
    ("sources", "sinks"),
    ("profiles", "trace"),
    ("analysis",),
    ("core", ""),  # "": the package's own __init__ (its version)
)
RANK = {name: len(LAYERS) - level for level, names in enumerate(LAYERS) for name in names}
ROOT_FILES = {"__init__.py", "__main__.py", "cli.py", "py.typed"}
ENTRY_POINTS = {"cli", "__main__"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    line: int
    target: str  # the imported module, dotted


def layer_of(module: str) -> str:
    """``profiler_app.core.model`` -> ``core``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def sources(package: Path = PACKAGE) -> dict[str, str]:
    """Every module of the package, dotted name -> source (a copy each call)."""
    return dict(_read(package))


@functools.cache
def _read(package: Path) -> dict[str, str]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path.read_text(encoding="utf-8")
    return found


@functools.cache
def _parsed(source: str) -> ast.Module:
    return ast.parse(source)


def imports(modules: Mapping[str, str]) -> list[Import]:
    """Each import of one module of ``modules`` by another, resolved to the module it loads: a
    name imported from a package is its submodule when there is one, else the package."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    packages = {name.rpartition(".")[0] for name in modules}
    found = []
    for module, source in modules.items():
        package = module if module in packages else module.rpartition(".")[0]
        for node in ast.walk(_parsed(source)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            else:
                continue
            for target in targets:
                resolved = resolve(target) if target.startswith(PACKAGE.name) else None
                if resolved is not None and resolved != module:
                    found.append(Import(module, node.lineno, resolved))
    return found


def climbs(found: list[Import]) -> list[str]:
    """Each import of a layer that is not below the importer's, as one line."""
    wrong = []
    for edge in found:
        source, target = layer_of(edge.module), layer_of(edge.target)
        if source == target:
            continue
        if source not in RANK or target not in RANK:
            wrong.append(f"{edge.module}:{edge.line} imports {edge.target}: a layer not in LAYERS")
        elif RANK[target] >= RANK[source]:
            wrong.append(
                f"{edge.module}:{edge.line} imports {edge.target}: {source or 'profiler_app'}"
                f" may import only layers below it, not {target or 'profiler_app'}"
            )
    return wrong


def cycles(found: list[Import]) -> list[list[str]]:
    """The import graph's cycles between modules (its strongly connected components)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        graph.setdefault(edge.module, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_root_holds_only_the_entry_points_and_packages() -> None:
    loose = sorted(
        entry.name
        for entry in PACKAGE.iterdir()
        if entry.is_file() and entry.name not in ROOT_FILES and entry.suffix != ".pyc"
    )
    assert loose == [], f"modules at the root of profiler_app/: {loose}"
    packages = {entry.name for entry in PACKAGE.iterdir() if (entry / "__init__.py").is_file()}
    assert packages == set(RANK) - ENTRY_POINTS - {""}, "LAYERS and the folders disagree"


def test_each_layer_imports_only_the_layers_below_it() -> None:
    assert climbs(imports(sources())) == []


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(imports(sources())) == []


def test_the_graph_sees_lazy_and_types_only_imports() -> None:
    found = imports(sources())
    by_module = {(edge.module, edge.target) for edge in found}
    # report loads its store-backed views inside its handler, after parsing
    assert ("profiler_app.commands.report", "profiler_app.reports.history") in by_module


def test_the_old_core_to_engines_import_is_caught() -> None:
    """The circle this layout removed: the model imported ``Identity`` from the engines (types
    only), the engines ``Prior`` from the analysis, and the analysis the model."""
    modules = sources()
    modules["profiler_app.core.model"] += (
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from profiler_app.profiles.engines import ENGINE_NAMES\n"
    )
    modules["profiler_app.profiles.engines"] += "\nfrom profiler_app.analysis import context\n"
    found = imports(modules)
    wrong = climbs(found)
    assert len(wrong) == 1
    assert wrong[0].startswith("profiler_app.core.model:")
    assert "imports profiler_app.profiles.engines: core may import only layers below it" in wrong[0]
    circle = {"profiler_app.core.model", "profiler_app.profiles.engines"}
    assert any(circle <= set(component) for component in cycles(found))


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("from profiler_app.sinks.store import models", "profiler_app.sinks.store.models"),
        ("from profiler_app.sinks.store import TableStore", "profiler_app.sinks.store"),
        ("from . import stats", "profiler_app.analysis.stats"),
        ("from .stats import summarise", "profiler_app.analysis.stats"),
        ("import profiler_app.core.model as model", "profiler_app.core.model"),
    ],
)
def test_imports_resolve_to_the_module_they_load(source: str, target: str) -> None:
    modules = sources()
    modules["profiler_app.analysis.probe"] = source
    assert [edge.target for edge in imports(modules) if edge.module.endswith(".probe")] == [target]


def test_a_sink_importing_the_daemon_is_named() -> None:
    modules = sources()
    modules["profiler_app.sinks.probe"] = "def f():\n    from profiler_app.daemon import Daemon\n"
    assert climbs(imports(modules)) == [
        "profiler_app.sinks.probe:2 imports profiler_app.daemon: sinks may import only layers"
        " below it, not daemon"
    ]
