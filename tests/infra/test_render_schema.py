"""The ``schema`` and ``values`` checks on the rendered graph: built-in kinds at the cluster's
version, custom resources (KEDA's, Karpenter's) against the pinned charts' CRDs, unknown kinds,
and values a chart does not have.

Test doubles as in test_render.py: the stack programs under Pulumi's mock engine, the pinned charts
rendered by Helm's own engine, kubernetes-validate and the charts' CRDs for an API server.
"""

from __future__ import annotations

import copy

import pytest

from infra import platform
from infra.render.graph import K8sObject, ObjectGraph
from infra.render.program import ProgramRun
from tests.infra.conftest import EKS_STACK
from tests.infra.render_support import check, graph_of, one

pytestmark = pytest.mark.charts


def test_schema_catches_dcgm_exporter_arguments_as_numbers() -> None:
    """The chart writes `arguments` unquoted: ["-c", "10000"] became an integer in args."""

    def as_before_the_fix(run: ProgramRun) -> None:
        values = run.release("dcgm-exporter").inputs["values"]
        values["arguments"] = ["-f", platform.DCGM_COUNTERS_PATH, "-c", "10000"]

    findings = check(graph_of(EKS_STACK, change_values=as_before_the_fix), "schema")
    assert findings == [
        "DaemonSet monitoring/dcgm-exporter (helm/dcgm-exporter): "
        "spec.template.spec.containers.0.args.3: 10000 is not of type 'string', 'null'"
    ]


def test_schema_checks_built_in_kinds_crd_kinds_and_unknown_kinds(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    service = one(graph, "Service", "gpu-profiler")
    service.manifest["spec"]["clusterIp"] = service.manifest["spec"].pop("clusterIP")
    monitor = one(graph, "ServiceMonitor", "gpu-profiler")
    monitor.manifest["spec"]["endpoints"][0]["prot"] = "metrics"
    rules = one(graph, "PrometheusRule", "gpu-rules")
    del rules.manifest["spec"]["groups"][0]["rules"][0]["expr"]
    graph.objects.append(
        K8sObject(
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
            source="stack",
        )
    )
    findings = {line.split(" (")[0]: line for line in check(graph, "schema")}
    assert set(findings) == {
        "Service gpu-profiler/gpu-profiler",
        "ServiceMonitor gpu-profiler/gpu-profiler",
        "PrometheusRule monitoring/gpu-rules",
        "Widget w",
    }
    assert "'clusterIp' was unexpected" in findings["Service gpu-profiler/gpu-profiler"]
    assert "'prot' was unexpected" in findings["ServiceMonitor gpu-profiler/gpu-profiler"]
    assert (
        "spec.groups.0.rules.0: 'expr' is a required property"
        in findings["PrometheusRule monitoring/gpu-rules"]
    )
    assert findings["Widget w"] == (
        "Widget w (stack): no schema for example.com/v1 Widget in Kubernetes v1.35.0, and no "
        "CRD for it in the stack"
    )


def test_values_catch_a_key_the_chart_does_not_have() -> None:
    """What the key inventories did, against the chart itself: Helm ignores unknown keys."""

    def misspelt(run: ProgramRun) -> None:
        values = run.release("dcgm-exporter").inputs["values"]
        values["serviceMonitor"]["honourLabels"] = True
        values["grafana"] = {"enabled": True}

    findings = check(graph_of(EKS_STACK, change_values=misspelt), "values")
    assert findings == [
        "release dcgm-exporter: value serviceMonitor.honourLabels is not one the chart "
        "dcgm-exporter-4.8.2.tgz has; Helm ignores it",
        "release dcgm-exporter: value grafana is not one the chart dcgm-exporter-4.8.2.tgz has; "
        "Helm ignores it",
    ]


def test_scaled_object_is_valid_for_kedas_own_crd(eks_graph: ObjectGraph) -> None:
    """The ScaledObject is checked against the schema of the CRD the pinned KEDA chart carries."""
    crd = one(eks_graph, "CustomResourceDefinition", "scaledobjects.keda.sh")
    assert crd.source == "helm/keda"
    graph = copy.deepcopy(eks_graph)
    scaled = one(graph, "ScaledObject", "llm-server")
    assert check(graph, "schema") == []
    scaled.manifest["spec"]["minReplicas"] = scaled.manifest["spec"].pop("minReplicaCount")
    scaled.manifest["spec"]["triggers"][0].pop("type")
    (finding,) = check(graph, "schema")
    assert finding.startswith("ScaledObject inference/llm-server (workload-autoscaling): ")
    assert "(and 1 more)" in finding


def test_node_pool_and_node_class_are_valid_for_the_pinned_crds(eks_graph: ObjectGraph) -> None:
    for name in ("nodepools.karpenter.sh", "ec2nodeclasses.karpenter.k8s.aws"):
        assert one(eks_graph, "CustomResourceDefinition", name).source == "helm/karpenter-crd"
    graph = copy.deepcopy(eks_graph)
    pool = one(graph, "NodePool", "gpu")
    pool.manifest["spec"]["disruption"]["consolidationPolicy"] = "WhenIdle"  # Karpenter v0.x
    node_class = one(graph, "EC2NodeClass", "gpu")
    node_class.manifest["spec"]["amiFamily"] = "Ubuntu"
    findings = {line.split(" (")[0]: line for line in check(graph, "schema")}
    assert set(findings) == {"NodePool gpu", "EC2NodeClass gpu"}
    assert (
        "spec.disruption.consolidationPolicy: 'WhenIdle' is not one of" in findings["NodePool gpu"]
    )
    assert "spec.amiFamily: 'Ubuntu' is not one of" in findings["EC2NodeClass gpu"]
