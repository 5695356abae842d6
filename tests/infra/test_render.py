"""The object graph of both stacks, their Helm releases rendered with the real charts.

Test doubles: the stack programs run under Pulumi's mock engine (infra/render/program.py) instead of
the Pulumi CLI and a cloud; the charts are the pinned ones from the chart cache
(``$GPU_CLUSTER_CHART_CACHE``), rendered by Helm's own engine (helm-python-sdk) with the
capabilities `helm install` would see; a Kubernetes API server is replaced by schema validation
(kubernetes-validate, the charts' CRDs).
Every check passes on the stacks as shipped (here, for several variants of their config), and each
fails, naming the object, on the defect it is there to catch (built by changing one value or one
object: test_render_<family>.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra import versions
from infra.render.checks import CHECKS, run_checks
from infra.render.graph import ObjectGraph, build_graph
from infra.render.program import FAKE_CERTIFICATE, run_stack
from infra.scheduling import PodPlacement, misfit
from tests.infra.conftest import CAPACITY_BLOCK_GROUP, EKS_STACK, H100_POOL, KUBEADM_STACK
from tests.infra.render_support import one, pod_spec

pytestmark = pytest.mark.charts


NO_FINDINGS = {name: [] for name in CHECKS}


VARIANTS: dict[str, tuple[Path, dict[str, Any], dict[str, str]]] = {
    "eks": (EKS_STACK, {}, {}),
    "kubeadm": (KUBEADM_STACK, {}, {}),
    "eks-with-options": (
        EKS_STACK,
        {
            "grafanaIngressHost": "grafana.example.org",
            "gpuMetricsIntervalSeconds": "5",
            "exampleWorkload": None,
            "profilerStore": "external",
            "profilerStoreCa": FAKE_CERTIFICATE,
        },
        {"profilerStoreUrl": "postgresql+psycopg://p:x@db/p", "grafanaAdminPassword": "pw"},
    ),
    "eks-rds": (EKS_STACK, {"profilerStore": "rds"}, {}),
    "kubeadm-sqlite": (KUBEADM_STACK, {"profilerStore": "sqlite"}, {}),
    "eks-hpa": (EKS_STACK, {"workloadAutoscaler": "hpa"}, {}),
    "eks-karpenter-only": (
        EKS_STACK,
        {"gpuNodeGroups": [], "karpenter": {"capacityTypes": ["spot", "on-demand"], "gpuLimit": 8}},
        {},
    ),
    "eks-without-karpenter": (EKS_STACK, {"karpenter": {"enabled": False}}, {}),
    "kubeadm-with-trial-runner": (KUBEADM_STACK, {"trialRunner": {"maxGpus": 4}}, {}),
    "kubeadm-example-without-autoscaler": (
        KUBEADM_STACK,
        {
            "workloadAutoscaler": "none",
            "exampleWorkload": {"namespace": "ml", "createNamespace": True, "minReplicas": 2},
        },
        {},
    ),
    # MIG mixed on the A100 group, time-slicing on the g5 group and Karpenter's pool.
    "eks-gpu-sharing": (
        EKS_STACK,
        {
            "gpuSharing": {
                "configs": {
                    "mig-mixed": {"migStrategy": "mixed"},
                    "shared-4": {"sharing": "time-slicing", "replicas": 4},
                }
            },
            "gpuNodeGroups": [
                {"name": "g5", "instanceTypes": ["g5.2xlarge"], "devicePluginConfig": "shared-4"},
                {
                    "name": "p4d",
                    "instanceTypes": ["p4d.24xlarge"],
                    "devicePluginConfig": "mig-mixed",
                },
            ],
            "karpenter": {"gpuLimit": 8, "devicePluginConfig": "shared-4"},
        },
        {},
    ),
    # Per-node configs on kubeadm, MPS (experimental) among them, time-sliced nodes by default.
    "kubeadm-gpu-sharing": (
        KUBEADM_STACK,
        {
            "gpuSharing": {
                "default": "shared-2",
                "configs": {
                    "mig-mixed": {"migStrategy": "mixed"},
                    "shared-2": {"sharing": "time-slicing", "replicas": 2},
                    "mps-4": {"sharing": "mps", "replicas": 4},
                },
            },
            "gpuNodeConfigs": {"gpu-1": "mig-mixed", "gpu-2": "mps-4"},
        },
        {},
    ),
    "kubeadm-with-options": (
        KUBEADM_STACK,
        {
            "gpuNodeNames": ["gpu-1"],
            "monitoringNamespace": "observability",
            "prometheusStorageClass": "local-path",
        },
        {},
    ),
}


H100_CONFIG: dict[str, Any] = {
    "availabilityZones": ["us-west-2a", "us-west-2b"],
    "gpuNodeGroups": [CAPACITY_BLOCK_GROUP],
    "karpenter": H100_POOL,
}


@pytest.mark.charts(versions.EFA_DEVICE_PLUGIN)
def test_every_check_passes_on_h100_capacity_with_efa() -> None:
    """Capacity Blocks, reservations, EFA and RAID0 : the node class
    is valid for the pinned CRDs, and the EFA device plugin reaches both EFA pools."""
    graph = build_graph(run_stack(EKS_STACK, overrides=H100_CONFIG))
    assert run_checks(graph) == NO_FINDINGS
    plugin = one(graph, "DaemonSet", "aws-efa-k8s-device-plugin")
    placement = PodPlacement.of(pod_spec(plugin))
    efa_pools = [p.name for p in graph.platform.pools if misfit(placement, p) is None]
    assert efa_pools == ["gpu-eks-h100-nodes", "karpenter/gpu"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_check_passes(variant: str) -> None:
    stack, overrides, secrets = VARIANTS[variant]
    graph = build_graph(run_stack(stack, overrides=overrides, secrets=secrets))
    assert run_checks(graph) == NO_FINDINGS


def test_the_graph_holds_what_helm_install_creates(eks_graph: ObjectGraph) -> None:
    sources = {o.source for o in eks_graph.objects}
    assert sources == {
        "stack",  # the StorageClass
        "gpu-platform",
        "gpu-profiler",
        "helm/nvidia-device-plugin",
        "helm/kube-prometheus-stack",
        "helm/dcgm-exporter",
        "helm/prometheus-adapter",
        "helm/keda",
        "workload-autoscaling",
        "karpenter",
        "helm/karpenter",
        "helm/karpenter-crd",
        "profiler-store",  # the CloudNativePG database, its pooler, Secrets and policies
        "helm/cloudnative-pg",
    }
    crds = {o.name for o in eks_graph.of_kind("CustomResourceDefinition")}
    assert {"prometheuses.monitoring.coreos.com", "servicemonitors.monitoring.coreos.com"} <= crds
    hooks = {o.name: o.hook for o in eks_graph.of_kind("Job")}
    assert hooks == {
        "kube-prometheus-stack-admission-create": frozenset({"pre-install", "pre-upgrade"}),
        "kube-prometheus-stack-admission-patch": frozenset({"post-install", "post-upgrade"}),
        # node-feature-discovery (GFD's subchart) removes its node labels on uninstall.
        "nvidia-device-plugin-node-feature-discovery-prune": frozenset({"post-delete"}),
    }
    # `helm test` pods are no part of an install.
    assert not [o for o in eks_graph.of_kind("Pod") if "test" in o.name]
    # Helm puts namespaced objects without a namespace into the release's.
    assert one(eks_graph, "Deployment", "kube-prometheus-stack-operator").namespace == "monitoring"
    # Capabilities as the cluster would report them: the adapter's APIServices are rendered.
    apis = {o.name for o in eks_graph.of_kind("APIService")}
    assert "v1beta1.custom.metrics.k8s.io" in apis
    assert eks_graph.platform.kube_version == "v1.35.0"


def test_services_the_smoke_suite_reaches(eks_graph: ObjectGraph) -> None:
    """Names, namespaces and ports the cluster smoke suite reaches through the API's proxy."""
    ports = {
        (o.namespace, o.name): {p["port"]: p.get("name") for p in o.manifest["spec"]["ports"]}
        for o in eks_graph.of_kind("Service")
    }
    assert ports[("monitoring", "kube-prometheus-stack-prometheus")][9090] == "http-web"
    assert ports[("monitoring", "kube-prometheus-stack-grafana")][80] == "http-web"
    assert ports[("monitoring", "dcgm-exporter")][9400] == "metrics"
    assert ports[("gpu-profiler", "gpu-profiler")][9401] == "metrics"
    assert ports[("monitoring", "prometheus-adapter")][443] == "https"
    daemon_sets = {(o.namespace, o.name) for o in eks_graph.of_kind("DaemonSet")}
    assert {
        ("nvidia-device-plugin", "nvidia-device-plugin"),
        ("monitoring", "dcgm-exporter"),
        ("gpu-profiler", "gpu-profiler"),
    } <= daemon_sets
    assert not [
        o
        for o in eks_graph.of_kind("Service")
        if o.manifest["spec"].get("type", "ClusterIP") != "ClusterIP"
    ]
