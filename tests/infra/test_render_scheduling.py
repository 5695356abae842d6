"""The ``scheduling`` check on the rendered graph: node pools with nodes, GPU DaemonSets on every
GPU pool, NVIDIA's device plugin and feature discovery where GPUs are, Karpenter's pools, and
Prometheus' volume.

Test doubles as in test_render.py: the stack programs under Pulumi's mock engine, the pinned charts
rendered by Helm's own engine, node pools from the stacks' config or a kubeadm inventory.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from infra.kubeadm_inventory import read_nodes
from infra.render.graph import ObjectGraph
from infra.render.program import ProgramRun
from infra.scheduling import NodePool, PodPlacement, Taint, misfit
from tests.infra.conftest import EKS_STACK
from tests.infra.render_support import check, graph_of, one, pod_spec

pytestmark = pytest.mark.charts


# The example inventory as it shipped: both workers GPU nodes, so every node tainted.
SHIPPED_INVENTORY = """\
[gpu_nodes]
gpu-1 ansible_host=192.0.2.11
gpu-2 ansible_host=192.0.2.12
[control_plane]
cp-1 ansible_host=192.0.2.10
[workers]
gpu-1
gpu-2
"""


def test_scheduling_catches_the_shipped_kubeadm_inventory(
    kubeadm_graph: ObjectGraph, tmp_path: Path
) -> None:
    """Every worker a GPU node and the control plane tainted: nothing system runs."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(SHIPPED_INVENTORY)
    graph = copy.deepcopy(kubeadm_graph)
    graph.platform.pools = [node.pool() for node in read_nodes(inventory)]
    findings = check(graph, "scheduling")
    stuck = {line.split(" (")[0] for line in findings}
    assert stuck == {
        "Deployment monitoring/kube-prometheus-stack-operator",
        "Deployment monitoring/kube-prometheus-stack-grafana",
        "Deployment monitoring/kube-prometheus-stack-kube-state-metrics",
        "Prometheus monitoring/kube-prometheus-stack-prometheus",
        "Alertmanager monitoring/kube-prometheus-stack-alertmanager",
        "Job monitoring/kube-prometheus-stack-admission-create",  # the pre-install hook
        "Job monitoring/kube-prometheus-stack-admission-patch",
        "Deployment monitoring/prometheus-adapter",
        "Deployment keda/keda-operator",
        "Deployment keda/keda-operator-metrics-apiserver",
        "Deployment keda/keda-admission-webhooks",
        "Deployment nvidia-device-plugin/nvidia-device-plugin-node-feature-discovery-gc",
        # The profiler's database: the operator, its instances and pooler, their volumes' provider.
        "Deployment cnpg-system/cloudnative-pg",
        "Cluster gpu-profiler-store/gpu-profiler-store",
        "Pooler gpu-profiler-store/gpu-profiler-store-pooler",
        "Deployment local-path-storage/local-path-provisioner",
    }
    assert all(
        "gpu-1: taint nvidia.com/gpu=present:NoSchedule not tolerated" in line
        and "cp-1: taint node-role.kubernetes.io/control-plane not tolerated" in line
        for line in findings
    )


def test_scheduling_needs_nodes_in_the_fitting_pool(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    system = next(p for p in graph.platform.pools if not p.is_gpu)
    graph.platform.pools = [
        NodePool(p.name, p.labels, p.taints, size=0) if p is system else p
        for p in graph.platform.pools
    ]
    findings = check(graph, "scheduling")
    assert any(
        "Deployment monitoring/kube-prometheus-stack-grafana" in line
        and "gpu-eks-system-nodes: no nodes (desired size 0)" in line
        for line in findings
    )
    assert not [line for line in findings if line.startswith("DaemonSet")]


def test_gpu_daemon_sets_must_reach_every_gpu_pool(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    graph.platform.pools.append(
        NodePool(
            "reserved-gpus",
            {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"},
            (Taint("nvidia.com/gpu", "NoSchedule", "present"), Taint("team", "NoSchedule", "ml")),
        )
    )
    missed = {line.split(" (")[0].split(":")[0] for line in check(graph, "scheduling")}
    assert missed == {
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin",
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin-gpu-feature-discovery",
        "DaemonSet monitoring/dcgm-exporter",
        "DaemonSet gpu-profiler/gpu-profiler",
        "GPU pool reserved-gpus",
    }


def test_device_plugin_as_rendered(eks_graph: ObjectGraph) -> None:
    plugin = one(eks_graph, "DaemonSet", "nvidia-device-plugin")
    # Beside it runs the config-manager sidecar that follows the node's config label.
    (container,) = [
        c for c in pod_spec(plugin)["containers"] if c["name"] == "nvidia-device-plugin-ctr"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    assert env["DEVICE_ID_STRATEGY"] == "uuid"
    # The chart adds SYS_ADMIN for volume-mounts: the plugin itself still sees every GPU.
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]


@pytest.mark.parametrize("graph_name", ["eks_graph", "kubeadm_graph"])
def test_gpu_feature_discovery_labels_every_gpu_pool(
    graph_name: str, request: pytest.FixtureRequest
) -> None:
    """GFD (nvidia.com/gpu.product, which trials place by) and the node-feature-discovery worker
    it needs run on every GPU pool; NFD's master and garbage collector fit a pool with nodes (the
    whole graph's checks, scheduling included, pass: test_render.py's test_every_check_passes)."""
    graph: ObjectGraph = request.getfixturevalue(graph_name)
    gfd = one(graph, "DaemonSet", "nvidia-device-plugin-gpu-feature-discovery")
    worker = one(graph, "DaemonSet", "nvidia-device-plugin-node-feature-discovery-worker")
    gpu_pools = [pool for pool in graph.platform.pools if pool.is_gpu]
    assert gpu_pools
    for daemon_set in (gfd, worker):
        placement = PodPlacement.of(pod_spec(daemon_set))
        assert [misfit(placement, pool) for pool in gpu_pools] == [None] * len(gpu_pools)
    for name in ("master", "gc"):
        deployment = one(graph, "Deployment", f"nvidia-device-plugin-node-feature-discovery-{name}")
        placement = PodPlacement.of(pod_spec(deployment))
        assert [p for p in graph.platform.pools if p.has_nodes and misfit(placement, p) is None]


def test_prometheus_volume_as_rendered(eks_graph: ObjectGraph, kubeadm_graph: ObjectGraph) -> None:
    prometheus = one(eks_graph, "Prometheus", "kube-prometheus-stack-prometheus")
    claim = prometheus.manifest["spec"]["storage"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "gp3-encrypted"
    storage_class = one(eks_graph, "StorageClass", "gp3-encrypted")
    assert storage_class.manifest["provisioner"] == "ebs.csi.aws.com"
    assert storage_class.manifest["volumeBindingMode"] == "WaitForFirstConsumer"
    assert storage_class.manifest["parameters"] == {"type": "gp3", "encrypted": "true"}
    # kubeadm clusters bring no storage provisioner: none unless prometheusStorageClass names one.
    plain = one(kubeadm_graph, "Prometheus", "kube-prometheus-stack-prometheus")
    assert "storage" not in plain.manifest["spec"]


def test_karpenter_pools_are_node_pools_with_nodes_on_demand(eks_graph: ObjectGraph) -> None:
    (pool,) = [p for p in eks_graph.platform.pools if p.name == "karpenter/gpu"]
    assert pool.is_gpu
    assert pool.provisioned
    assert pool.labels["karpenter.sh/nodepool"] == "gpu"
    assert pool.labels["kubernetes.io/os"] == "linux"
    assert Taint("nvidia.com/gpu", "NoSchedule", "present") in pool.taints


def test_scheduling_counts_on_karpenter_to_launch_gpu_nodes() -> None:
    """With no GPU node group, the example GPU workload fits only because Karpenter adds nodes."""
    graph = graph_of(EKS_STACK, {"gpuNodeGroups": []})
    assert check(graph, "scheduling") == []
    graph.platform.pools = [
        NodePool(p.name, p.labels, p.taints, p.size) for p in graph.platform.pools
    ]
    (finding,) = check(graph, "scheduling")
    assert finding.startswith("Deployment inference/llm-server (workload-autoscaling): fits no")
    assert "karpenter/gpu: no nodes (desired size 0)" in finding


def test_scheduling_catches_gpu_nodes_the_device_plugin_never_reaches() -> None:
    """The pitfall: a Karpenter node is initialised only once the device plugin registers GPUs."""

    def reserved(run: ProgramRun) -> None:
        pool = run.one("kubernetes:karpenter.sh/v1:NodePool").inputs
        pool["spec"]["template"]["spec"]["taints"].append(
            {"key": "team", "value": "ml", "effect": "NoSchedule"}
        )

    findings = check(graph_of(EKS_STACK, change_values=reserved), "scheduling")
    assert {line.split(" (")[0].split(":")[0] for line in findings} == {
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin",
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin-gpu-feature-discovery",
        "DaemonSet monitoring/dcgm-exporter",
        "DaemonSet gpu-profiler/gpu-profiler",
        "GPU pool karpenter/gpu",
    }
    assert (
        "GPU pool karpenter/gpu: no NVIDIA device plugin runs there, so its nodes never register "
        "nvidia.com/gpu (Karpenter never counts them initialised)" in findings
    )
