"""The ``conflicts`` check: no two objects share kind, namespace and name (two releases'
APIServices)."""

from __future__ import annotations

from infra.render.graph import K8sObject, ObjectGraph


def conflict_findings(graph: ObjectGraph) -> list[str]:
    """Two objects of one kind, namespace and name: the second install fails, or takes the first
    over (two metrics servers for one APIService)."""
    seen: dict[tuple[str, str, str | None, str], K8sObject] = {}
    findings = []
    for obj in graph.objects:
        key = (obj.api_version.rpartition("/")[0], obj.kind, obj.namespace, obj.name)
        first = seen.setdefault(key, obj)
        if first is not obj:
            findings.append(f"{obj}: {first.source} creates it too")
    return findings
