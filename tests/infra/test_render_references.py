"""The ``namespaces``, ``references``, ``conflicts`` and ``scalers`` checks on the rendered graph:
namespaces that exist, URLs, Services and roles that resolve, no object created twice, scalers
that scale a workload of the stack.

Test doubles as in test_render.py: the stack programs under Pulumi's mock engine, the pinned charts
rendered by Helm's own engine.
"""

from __future__ import annotations

import copy

import pytest

from infra import monitoring, platform
from infra.render.graph import ObjectGraph
from infra.render.program import ProgramRun
from tests.infra.conftest import EKS_STACK
from tests.infra.render_support import check, graph_of, one, pod_spec

pytestmark = pytest.mark.charts


def test_namespaces_catch_a_workload_in_a_namespace_nothing_creates() -> None:
    """The example HPA in namespace `inference`, which nothing created."""
    graph = graph_of(EKS_STACK, {"exampleWorkload": {"namespace": "inference"}})
    findings = check(graph, "namespaces")
    assert {line.split(" (")[0] for line in findings} == {
        "Deployment inference/llm-server",
        "Service inference/llm-server",
        "PodMonitor inference/llm-server",
        "ScaledObject inference/llm-server",
    }
    assert all(
        "namespace inference is neither created by the stack nor built in" in f for f in findings
    )
    assert check(graph, "namespaces", frozenset({"inference"})) == []


def test_references_catch_urls_and_service_refs_that_lead_nowhere(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    profiler = one(graph, "DaemonSet", "gpu-profiler")
    for env in pod_spec(profiler)["containers"][0]["env"]:
        if env["name"] == "GPU_PROFILER_PROMETHEUS_URL":
            env["value"] = env["value"].replace(":9090", ":9091")
    adapter = one(graph, "Deployment", "prometheus-adapter")
    container = pod_spec(adapter)["containers"][0]
    container["args"] = [a.replace(".monitoring.svc", ".monitor.svc") for a in container["args"]]
    api = one(graph, "APIService", "v1beta1.custom.metrics.k8s.io")
    api.manifest["spec"]["service"]["name"] = "adapter"
    findings = check(graph, "references")
    assert sorted(findings) == [
        "APIService v1beta1.custom.metrics.k8s.io (helm/prometheus-adapter): spec.service: "
        "no Service monitoring/adapter port 443",
        "DaemonSet gpu-profiler/gpu-profiler (gpu-profiler): container gpu-profiler env "
        "GPU_PROFILER_PROMETHEUS_URL: kube-prometheus-stack-prometheus.monitoring.svc:9091: "
        "Service monitoring/kube-prometheus-stack-prometheus has no port 9091",
        "Deployment monitoring/prometheus-adapter (helm/prometheus-adapter): container "
        "prometheus-adapter args: kube-prometheus-stack-prometheus.monitor.svc:9090: "
        "namespace monitor does not exist",
    ]


def test_grafana_datasource_url_is_checked(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    datasources = one(graph, "ConfigMap", "kube-prometheus-stack-grafana-datasource")
    text = datasources.manifest["data"]["datasource.yaml"]
    assert "http://kube-prometheus-stack-prometheus.monitoring:9090/" in text
    datasources.manifest["data"]["datasource.yaml"] = text.replace(
        "kube-prometheus-stack-prometheus.monitoring", "prometheus.monitoring"
    )
    findings = check(graph, "references")
    assert any("no Service prometheus in namespace monitoring" in line for line in findings)


def test_references_catch_a_binding_to_a_missing_role(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    graph.objects.remove(one(graph, "ClusterRole", platform.GRAFANA_SIDECAR_ROLE))
    assert check(graph, "references") == [
        "ClusterRoleBinding kube-prometheus-stack-grafana-clusterrolebinding "
        "(helm/kube-prometheus-stack): roleRef ClusterRole grafana-sidecar-configmap-reader does "
        "not exist"
    ]


def test_conflicts_catch_two_external_metrics_servers() -> None:
    """Defect: prometheus-adapter and KEDA both registering v1beta1.external.metrics.k8s.io."""

    def as_before_the_fix(run: ProgramRun) -> None:
        values = run.release("prometheus-adapter").inputs["values"]
        values["rules"]["external"] = monitoring.adapter_rules()["external"]

    graph = graph_of(EKS_STACK, change_values=as_before_the_fix)
    assert check(graph, "conflicts") == [
        "APIService v1beta1.external.metrics.k8s.io (helm/keda): helm/prometheus-adapter "
        "creates it too"
    ]


def test_scalers_and_references_catch_a_trigger_that_leads_nowhere(
    eks_graph: ObjectGraph,
) -> None:
    graph = copy.deepcopy(eks_graph)
    scaled = one(graph, "ScaledObject", "llm-server")
    scaled.manifest["spec"]["scaleTargetRef"]["name"] = "llm"
    metadata = scaled.manifest["spec"]["triggers"][0]["metadata"]
    metadata["serverAddress"] = metadata["serverAddress"].replace(":9090", ":9091")
    assert check(graph, "scalers") == [
        "ScaledObject inference/llm-server (workload-autoscaling): scales Deployment "
        "inference/llm, which the stack does not create"
    ]
    assert check(graph, "references") == [
        "ScaledObject inference/llm-server (workload-autoscaling): trigger 0 serverAddress: "
        "kube-prometheus-stack-prometheus.monitoring.svc:9091: Service "
        "monitoring/kube-prometheus-stack-prometheus has no port 9091"
    ]
    del metadata["query"]
    assert "trigger 0 needs serverAddress and query" in check(graph, "scalers")[1]
