"""Who reaches whom, checked on the rendered charts: the store's pooler admits Grafana's pods,
whose labels the chart sets, and Grafana's sidecars read ConfigMaps of the monitoring namespace
only.

Test double: Pulumi's mock engine and the charts rendered by Helm instead of a cluster.
"""

from __future__ import annotations

from typing import Any

import pytest

from infra.platform import GRAFANA_POD_LABELS
from infra.render.graph import ObjectGraph

pytestmark = pytest.mark.charts


def _grafana(graph: ObjectGraph) -> dict[str, Any]:
    (deployment,) = [
        d
        for d in graph.of_kind("Deployment")
        if any(c["name"] == "grafana" for c in d.manifest["spec"]["template"]["spec"]["containers"])
    ]
    template: dict[str, Any] = deployment.manifest["spec"]["template"]
    return template


def test_the_poolers_grafana_peer_selects_grafanas_pods(eks_graph: ObjectGraph) -> None:
    labels = _grafana(eks_graph)["metadata"]["labels"]
    assert GRAFANA_POD_LABELS.items() <= labels.items()
    policy = eks_graph.find("NetworkPolicy", "gpu-profiler-store-pooler", "gpu-profiler-store")
    assert policy is not None
    peers = policy.manifest["spec"]["ingress"][0]["from"]
    assert {"matchLabels": GRAFANA_POD_LABELS} in [p.get("podSelector") for p in peers]


@pytest.mark.parametrize("sidecar", ["grafana-sc-dashboard", "grafana-sc-datasources"])
def test_grafanas_sidecars_read_the_monitoring_namespace_only(
    eks_graph: ObjectGraph, sidecar: str
) -> None:
    spec = _grafana(eks_graph)["spec"]
    containers = {c["name"]: c for c in [*spec["containers"], *spec.get("initContainers", [])]}
    env = {e["name"]: e.get("value") for e in containers[sidecar]["env"]}
    assert env["NAMESPACE"] == "monitoring"
