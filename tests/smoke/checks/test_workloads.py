"""The GPU layer runs: every pod of its namespaces, and the NVIDIA device plugin, dcgm-exporter
and the profiler DaemonSets on every GPU node."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, eventually, fail_on
from tests.smoke.checks.layout import DaemonSetRef, SmokeSettings
from tests.smoke.checks.scheduling import (
    Json,
    gpu_nodes,
    is_ready,
    name,
    why_not_placed,
    why_not_running,
)

pytestmark = pytest.mark.smoke


def _owned_pods(cluster: Cluster, daemon_set: Json) -> list[Json]:
    namespace = daemon_set["metadata"]["namespace"]
    match = (daemon_set["spec"].get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{key}={value}" for key, value in sorted(match.items()))
    pods = cluster.list(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector})
    uid = daemon_set["metadata"].get("uid")
    return [
        pod
        for pod in pods
        if any(owner.get("uid") == uid for owner in pod["metadata"].get("ownerReferences") or [])
    ]


def rollout_problems(cluster: Cluster, ref: DaemonSetRef) -> list[str]:
    path = f"/apis/apps/v1/namespaces/{ref.namespace}/daemonsets/{ref.name}"
    daemon_set = cluster.get_or_none(path)
    if daemon_set is None:
        return [
            f"DaemonSet {ref} does not exist: deploy the GPU layer (`pulumi up`), or give the "
            "namespaces your stack config uses (--monitoring-namespace, --profiler-namespace)"
        ]
    problems = []
    status = daemon_set.get("status") or {}
    generation = daemon_set["metadata"].get("generation", 0)
    if status.get("observedGeneration", 0) < generation:
        problems.append(f"the DaemonSet controller has not yet acted on generation {generation}")
    counts = {
        key: int(status.get(key) or 0)
        for key in ("desiredNumberScheduled", "updatedNumberScheduled", "numberReady")
    }
    if len(set(counts.values())) > 1:
        problems.append(
            f"{counts['numberReady']} of {counts['desiredNumberScheduled']} pods ready, "
            f"{counts['updatedNumberScheduled']} up to date"
        )
    template = daemon_set["spec"]["template"]["spec"]
    pods_by_node = {pod["spec"].get("nodeName"): pod for pod in _owned_pods(cluster, daemon_set)}
    for node in gpu_nodes(cluster):
        pod = pods_by_node.get(name(node))
        if pod is None:
            reasons = why_not_placed(node, template, daemon_set=True) or [
                "nothing in the node's taints or labels explains it; "
                f"`kubectl -n {ref.namespace} describe daemonset {ref.name}`"
            ]
            problems.append(f"no pod on GPU node {name(node)}: {'; '.join(reasons)}")
        elif not (pod["status"].get("phase") == "Running" and is_ready(pod)):
            problems.append(f"pod {name(pod)} on {name(node)} is not ready: {why_not_running(pod)}")
    return problems


@pytest.mark.parametrize("component", ["device-plugin", "dcgm-exporter", "profiler"])
def test_daemon_set_is_ready_on_every_gpu_node(
    cluster: Cluster, settings: SmokeSettings, component: str
) -> None:
    ref = settings.daemon_sets()[component]
    fail_on(
        eventually(lambda: rollout_problems(cluster, ref), settings.timeout_seconds),
        f"DaemonSet {ref} is not ready on every GPU node",
    )


def test_every_pod_of_the_gpu_layer_runs(cluster: Cluster, settings: SmokeSettings) -> None:
    """Prometheus, Grafana, the operator, the adapter and the DaemonSets' pods: Pending ones name
    what the scheduler said (a taint nothing tolerates, too little CPU, ...)."""

    def probe() -> list[str]:
        problems = []
        for namespace in settings.gpu_layer_namespaces():
            for pod in cluster.list(f"/api/v1/namespaces/{namespace}/pods"):
                phase = (pod.get("status") or {}).get("phase")
                if phase == "Succeeded" or (phase == "Running" and is_ready(pod)):
                    continue
                node = pod["spec"].get("nodeName")
                where = f" on {node}" if node else ""
                problems.append(f"{namespace}/{name(pod)}{where}: {why_not_running(pod)}")
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds),
        "Pods of the GPU layer are not running",
    )
