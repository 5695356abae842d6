"""What a GPU cluster's controllers and node agents have made of the scenario once it is up:
the GPU layer's pods and DaemonSets, the node state the device plugin and the profiler publish,
and the Services. Pure functions of the scenario; the stand-in API server stores the result.

The device plugin's part is a TEST DOUBLE of NVIDIA/k8s-device-plugin v0.20.0 (the chart
infra/versions.py pins): it registers ``nvidia.com/gpu`` (internal/plugin/server.go), and the
kubelet counts every device in capacity but only healthy ones in allocatable; GPU feature
discovery's labels follow internal/lm/resource.go (``gfd_labels`` here, MIG and sharing in
sharing.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_RESOURCE
from infra.platform import GRAFANA_SERVICE, PROMETHEUS_SERVICE
from profiler_app.sinks.kubernetes import PROFILED_AT
from tests.smoke.checks.layout import (
    DEFAULT_DOMAIN,
    INSTANCE_TYPE_LABEL,
    KEDA_NAMESPACE,
    SmokeSettings,
)
from tests.smoke.checks.services import KARPENTER_DEPLOYMENT, KEDA_DEPLOYMENTS
from tests.support.gpu_cluster import objects, sharing
from tests.support.gpu_cluster.objects import Json, Workload
from tests.support.gpu_cluster.scenario import GpuNode, Scenario

NAMES = SmokeSettings()  # the namespaces and DaemonSets the stacks create, by default
STORE_URL_FROM_SECRET = {
    "name": "GPU_PROFILER_STORE_URL",
    "valueFrom": {"secretKeyRef": {"name": "gpu-profiler-store", "key": "store-url"}},
}
_DAEMON_SETS = NAMES.daemon_sets()
DEVICE_PLUGIN = _DAEMON_SETS["device-plugin"].name
DCGM_EXPORTER = _DAEMON_SETS["dcgm-exporter"].name
PROFILER = _DAEMON_SETS["profiler"].name
ADAPTER = "prometheus-adapter"
KARPENTER = KARPENTER_DEPLOYMENT[1]
KEDA_METRICS_SERVER = KEDA_DEPLOYMENTS[1]
WORKLOADS = (
    *(
        Workload("DaemonSet", ref.namespace, ref.name, ref.name, on_gpu_nodes=True)
        for ref in _DAEMON_SETS.values()
    ),
    Workload(
        "StatefulSet", NAMES.monitoring_namespace, f"prometheus-{PROMETHEUS_SERVICE}", "prometheus"
    ),
    Workload("Deployment", NAMES.monitoring_namespace, GRAFANA_SERVICE, "grafana"),
    Workload(
        "Deployment", NAMES.monitoring_namespace, "kube-prometheus-stack-operator", "operator"
    ),
    Workload("Deployment", NAMES.monitoring_namespace, ADAPTER, ADAPTER),
)
KARPENTER_WORKLOAD = Workload("Deployment", *KARPENTER_DEPLOYMENT, KARPENTER)
KEDA_WORKLOADS = tuple(
    Workload("Deployment", KEDA_NAMESPACE, name, name) for name in KEDA_DEPLOYMENTS
)


def workloads_of(scenario: Scenario) -> tuple[Workload, ...]:
    """The GPU layer's workloads, and Karpenter's and KEDA's where the scenario has them."""
    return (
        *WORKLOADS,
        *((KARPENTER_WORKLOAD,) if scenario.karpenter else ()),
        *(KEDA_WORKLOADS if scenario.keda else ()),
    )


def nodes(scenario: Scenario) -> dict[str, Json]:
    """The nodes as they join: labels and taints, no GPU resource yet."""
    made = {}
    for gpu_node in scenario.gpu_nodes:
        labels = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE} if gpu_node.labelled else {}
        if gpu_node.instance_type:
            labels[INSTANCE_TYPE_LABEL] = gpu_node.instance_type
        taints = [taint.manifest() for taint in gpu_node.taints]
        made[gpu_node.name] = objects.node_manifest(gpu_node.name, labels=labels, taints=taints)
    for name in scenario.system_nodes:
        made[name] = objects.node_manifest(name, labels={}, taints=[])
    return made


def _problem(scenario: Scenario, workload: Workload, node: str) -> tuple[str, str] | None:
    for unready in scenario.unready:
        if unready.workload == workload.name and unready.node in (None, node):
            return unready.reason, unready.message
    return None


def workloads(scenario: Scenario, cluster_nodes: dict[str, Json]) -> tuple[list[Json], list[Json]]:
    """The GPU layer's pods and DaemonSets: a DaemonSet's pod on every node that admits it, a
    Deployment's or StatefulSet's one pod on the first node that does, or Pending."""
    pods, daemon_sets = [], []
    for workload in workloads_of(scenario):
        owner_uid = objects.suffix(workload.kind, workload.namespace, workload.name, length=12)
        fits, reasons = [], []
        for name, node in sorted(cluster_nodes.items()):
            reason = objects.misfit(node, workload.pod_spec(), free_gpus=0)
            if reason:
                reasons.append(reason)
            else:
                fits.append(name)
        placements: list[str | None] = list(fits)
        if workload.kind != "DaemonSet":
            placements = placements[:1] or [None]
        made = [
            objects.workload_pod(
                workload,
                owner_uid,
                node,
                problem=_problem(scenario, workload, node) if node else None,
                unschedulable="" if node else objects.unschedulable_message(reasons),
            )
            for node in placements
        ]
        pods += made
        if workload.kind == "DaemonSet":
            ready = sum(1 for pod in made if objects.is_ready(pod))
            daemon_set = objects.daemon_set_manifest(workload, owner_uid, len(made), ready)
            if workload.name == PROFILER and scenario.store is not None:
                # The store URL from a Secret: the profiler keeps its rows in a database.
                container = daemon_set["spec"]["template"]["spec"]["containers"][0]
                container["env"] = [STORE_URL_FROM_SECRET]
            daemon_sets.append(daemon_set)
    return pods, daemon_sets


def gfd_labels(gpu_node: GpuNode) -> dict[str, str]:
    """What NVIDIA's GPU feature discovery labels a node's whole GPUs with, as
    NVIDIA/k8s-device-plugin v0.20.0 internal/lm/resource.go does (``baseLabeler``: product with
    dashes, count, replicas 1 and sharing-strategy none without sharing; memory in MiB, fixed
    here). sharing.gfd_labels adds what MIG and time-slicing change."""
    return {
        "nvidia.com/gpu.product": gpu_node.model.replace(" ", "-"),
        "nvidia.com/gpu.count": str(gpu_node.gpus),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "23028",
    }


def published_node(node: Json, gpu_node: GpuNode, pods: list[Json], scenario: Scenario) -> Json:
    """The node after the device plugin (GPU capacity) and the profiler (annotations) wrote to
    it, where their pods are ready."""
    updated = copy.deepcopy(node)
    if objects.ready_pod_of(pods, DEVICE_PLUGIN, gpu_node.name):
        updated["status"]["capacity"][GPU_RESOURCE] = str(gpu_node.gpus)
        allocatable = gpu_node.gpus - gpu_node.unhealthy_gpus
        updated["status"]["allocatable"][GPU_RESOURCE] = str(allocatable)
        if sharing.shares(gpu_node):  # MIG devices or time-sliced replicas instead
            for field in ("capacity", "allocatable"):
                updated["status"][field].pop(GPU_RESOURCE)
                updated["status"][field] |= sharing.resources(gpu_node, scenario)
        if scenario.gfd:  # GPU feature discovery runs with the device plugin (its chart)
            updated["metadata"]["labels"] |= gfd_labels(gpu_node) | sharing.gfd_labels(gpu_node)
    if objects.ready_pod_of(pods, PROFILER, gpu_node.name):
        stamp = objects.now_rfc3339(scenario.profile_age_seconds)
        updated["metadata"]["annotations"] = {
            f"{DEFAULT_DOMAIN}/{PROFILED_AT}": stamp,
            **{f"{DEFAULT_DOMAIN}/gpu-{index}-job-type": "idle" for index in range(gpu_node.gpus)},
        }
    return updated


@dataclass(frozen=True)
class Service:
    manifest: Json
    app: str | None  # app.kubernetes.io/name of the pods behind it
    backend: str | None  # URL of the process that answers for it here, if any


def services(scenario: Scenario, backends: dict[str, str]) -> dict[tuple[str, str], Service]:
    """The cluster's Services; ``backends`` maps an app to the local URL answering for it."""
    monitoring = NAMES.monitoring_namespace
    entries = [
        (monitoring, PROMETHEUS_SERVICE, 9090, "prometheus"),
        (monitoring, GRAFANA_SERVICE, 80, "grafana"),
        (monitoring, DCGM_EXPORTER, 9400, DCGM_EXPORTER),
        (monitoring, ADAPTER, 443, ADAPTER),
        (NAMES.profiler_namespace, PROFILER, 9401, PROFILER),
        ("default", "kubernetes", 443, None),
        ("kube-system", "kube-dns", 53, None),
    ]
    made = {
        (namespace, name): Service(
            objects.service_manifest(namespace, name, port), app, backends.get(app or "")
        )
        for namespace, name, port, app in entries
    }
    for exposed in scenario.node_port_services:
        namespace, name = exposed.split("/")
        manifest = objects.service_manifest(namespace, name, 80, kind="NodePort")
        made[namespace, name] = Service(manifest, None, None)
    return made
