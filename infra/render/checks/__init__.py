"""Checks of a stack's whole object graph: what must hold for `pulumi up` to converge and work.

Each check returns findings, one line each, naming the object and what to fix; none means pass.
One module per check, named as the check (its docstring says what it holds); ``objects`` is what
several of them read off the graph. ``CHECKS`` runs them in the order of
``infra.render.CHECK_NAMES``.
"""

from __future__ import annotations

from collections.abc import Callable

from infra.render.checks.admission import admission_findings
from infra.render.checks.conflicts import conflict_findings
from infra.render.checks.grafana import grafana_findings
from infra.render.checks.monitoring import monitoring_findings
from infra.render.checks.namespaces import missing_namespaces
from infra.render.checks.references import reference_findings
from infra.render.checks.scalers import scaler_findings
from infra.render.checks.scheduling import scheduling_findings
from infra.render.checks.schema import invalid_objects
from infra.render.checks.values import values_findings
from infra.render.graph import ObjectGraph

Check = Callable[[ObjectGraph, frozenset[str]], list[str]]
CHECKS: dict[str, Check] = {
    "values": lambda graph, _assumed: values_findings(graph),
    "schema": lambda graph, _assumed: invalid_objects(graph),
    "namespaces": missing_namespaces,
    "monitoring": lambda graph, _assumed: monitoring_findings(graph),
    "references": reference_findings,
    "grafana": lambda graph, _assumed: grafana_findings(graph),
    "scheduling": lambda graph, _assumed: scheduling_findings(graph),
    "conflicts": lambda graph, _assumed: conflict_findings(graph),
    "scalers": lambda graph, _assumed: scaler_findings(graph),
    "admission": lambda graph, _assumed: admission_findings(graph),
}


def run_checks(
    graph: ObjectGraph, assumed_namespaces: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Every check's findings, by check name."""
    return {name: check(graph, assumed_namespaces) for name, check in CHECKS.items()}
