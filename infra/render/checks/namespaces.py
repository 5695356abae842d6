"""The ``namespaces`` check: every namespaced object in a namespace that exists or that the stack
creates (or that ``--assume-namespace`` says exists)."""

from __future__ import annotations

from infra.render.graph import ObjectGraph


def existing_namespaces(graph: ObjectGraph, assumed: frozenset[str] = frozenset()) -> set[str]:
    return {
        *graph.platform.namespaces,
        *assumed,
        *(ns.name for ns in graph.of_kind("Namespace")),
    }


def missing_namespaces(graph: ObjectGraph, assumed: frozenset[str] = frozenset()) -> list[str]:
    existing = existing_namespaces(graph, assumed)
    scopes = graph.crd_scopes()
    return [
        f"{obj}: namespace {obj.namespace or '(none)'} is neither created by the stack nor built "
        f"in; create it, or say it exists (render --assume-namespace)"
        for obj in graph.objects
        if graph.is_namespaced(obj, scopes) and obj.namespace not in existing
    ]


def namespace_labels(graph: ObjectGraph, name: str) -> dict[str, str]:
    namespace = graph.find("Namespace", name)
    labels = dict(namespace.labels) if namespace else {}
    labels["kubernetes.io/metadata.name"] = name
    return labels
