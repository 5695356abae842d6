"""GPU nodes: Ready, labelled and tainted, and offering every GPU they have to the scheduler."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, eventually, fail_on
from tests.smoke.checks.layout import (
    DCGM_FIELDS,
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    SmokeSettings,
)
from tests.smoke.checks.prometheus import Prometheus
from tests.smoke.checks.scheduling import (
    gpu_count,
    gpu_nodes,
    has_gpu_label,
    has_gpu_taint,
    name,
    ready_condition,
)

pytestmark = pytest.mark.smoke


def test_gpu_nodes_are_ready(cluster: Cluster, settings: SmokeSettings) -> None:
    def probe() -> list[str]:
        nodes = gpu_nodes(cluster)
        problems = []
        if len(nodes) < settings.min_gpu_nodes:
            problems.append(
                f"{len(nodes)} GPU node(s), expected at least {settings.min_gpu_nodes}: scale a "
                "GPU node group up (desiredSize) or add GPU hosts to the inventory"
            )
        for node in nodes:
            condition = ready_condition(node) or {}
            if condition.get("status") != "True":
                problems.append(
                    f"{name(node)} is not Ready ({condition.get('reason', 'no Ready condition')}: "
                    f"{condition.get('message', '')}): look at its kubelet "
                    "(journalctl -u kubelet on the node)"
                )
        return problems

    fail_on(eventually(probe, settings.timeout_seconds), "GPU nodes are missing or not Ready")


def test_gpu_nodes_are_labelled_and_tainted(cluster: Cluster, settings: SmokeSettings) -> None:
    label = f"{GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}"
    taint = f"{GPU_TAINT_KEY}={GPU_TAINT_VALUE}:{GPU_TAINT_EFFECT}"

    def probe() -> list[str]:
        problems = []
        for node in gpu_nodes(cluster):
            if not has_gpu_label(node):
                problems.append(
                    f"{name(node)} lacks the label {label}: the GPU DaemonSets select nodes by it "
                    "(set it in the node group's labels, or the kubeadm node's node-labels)"
                )
            if not has_gpu_taint(node):
                problems.append(
                    f"{name(node)} lacks the taint {taint}: without it any pod may take the node "
                    "(set it in the node group's taints, or the kubeadm node's taints)"
                )
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds), "GPU nodes are not all labelled and tainted"
    )


def test_gpu_nodes_offer_every_gpu_they_have(
    cluster: Cluster, settings: SmokeSettings, cluster_prometheus: Prometheus
) -> None:
    """Allocatable nvidia.com/gpu (the device plugin's count) equals the GPUs dcgm-exporter
    reads on the node through NVML."""
    field = DCGM_FIELDS[0]
    plugin = settings.daemon_sets()["device-plugin"]

    def probe() -> list[str]:
        reported = cluster_prometheus.gpus_by_node(field)
        problems = []
        for node in gpu_nodes(cluster):
            allocatable = gpu_count(node, "allocatable")
            present = len(reported.get(name(node), ()))
            if allocatable is None:
                problems.append(
                    f"{name(node)} has no allocatable {GPU_RESOURCE}: the NVIDIA device plugin "
                    f"has not registered its GPUs (is DaemonSet {plugin} running there?)"
                )
            elif not present:
                problems.append(
                    f"{name(node)}: dcgm-exporter reports no GPU there ({field}), so its "
                    f"allocatable {GPU_RESOURCE} ({allocatable}) cannot be confirmed: see the "
                    "DCGM series check"
                )
            elif allocatable != present:
                problems.append(
                    f"{name(node)}: allocatable {GPU_RESOURCE} is {allocatable}, but the node has "
                    f"{present} GPU(s) (dcgm-exporter): the device plugin holds back unhealthy "
                    f"GPUs, or a second device plugin runs there; read the logs of {plugin}'s "
                    "pod on that node"
                )
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds),
        "GPU nodes do not offer every GPU they have",
    )
