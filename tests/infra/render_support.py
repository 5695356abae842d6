"""What the render tests share: a stack's graph with one value changed, an object by kind and
name, a check's findings, a workload's pod spec (test doubles as in test_render.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.render.checks import CHECKS
from infra.render.graph import K8sObject, ObjectGraph, build_graph
from infra.render.program import ProgramRun, run_stack


def graph_of(
    stack: Path,
    overrides: dict[str, Any] | None = None,
    change_values: Callable[[ProgramRun], None] | None = None,
) -> ObjectGraph:
    """A stack's graph, its release values changed first (to rebuild a defect) when asked."""
    run = run_stack(stack, overrides=overrides)
    if change_values is not None:
        change_values(run)
    return build_graph(run)


def one(graph: ObjectGraph, kind: str, name: str) -> K8sObject:
    """The one object of ``kind`` named ``name`` (in any namespace)."""
    found = [o for o in graph.objects if o.kind == kind and o.name == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def check(graph: ObjectGraph, name: str, assumed: frozenset[str] = frozenset()) -> list[str]:
    """The findings of the check ``name``."""
    return CHECKS[name](graph, assumed)


def pod_spec(obj: K8sObject) -> dict[str, Any]:
    """The pod spec of a Deployment's, StatefulSet's or DaemonSet's template."""
    spec: dict[str, Any] = obj.manifest["spec"]["template"]["spec"]
    return spec
