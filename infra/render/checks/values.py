"""The ``values`` check: every value a release passes is one its chart has (Helm ignores the
others)."""

from __future__ import annotations

from infra.render.charts import ignored_values
from infra.render.graph import ObjectGraph


def values_findings(graph: ObjectGraph) -> list[str]:
    return [
        f"release {release.name}: value {key} is not one the chart {release.chart.name} has; "
        f"Helm ignores it"
        for release in graph.releases
        for key in ignored_values(release.chart, release.values)
    ]
