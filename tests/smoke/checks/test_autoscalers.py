"""What adds GPU nodes and scales GPU workloads is ready: Karpenter with its NodePools and
EC2NodeClasses, KEDA with its metrics server and ScaledObjects. Each check is skipped, saying so,
where the cluster serves no such API (kubeadm, or the component turned off)."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, eventually, fail_on
from tests.smoke.checks.layout import KEDA_NAMESPACE, SmokeSettings
from tests.smoke.checks.services import (
    EXTERNAL_METRICS_API_SERVICE,
    KARPENTER_DEPLOYMENT,
    KEDA_DEPLOYMENTS,
    NODE_CLASSES_PATH,
    NODE_POOLS_PATH,
    SCALED_OBJECTS_PATH,
    NotServedError,
    api_service_problem,
    condition,
    deployment_problems,
    describe_condition,
    list_or_not_served,
    not_ready,
)

pytestmark = pytest.mark.smoke


def _served_or_skip(cluster: Cluster, path: str, what: str) -> None:
    try:
        list_or_not_served(cluster, path)
    except NotServedError:
        pytest.skip(f"{what} is not installed: the cluster serves no {path}")


def test_karpenter_and_its_node_pools_are_ready(cluster: Cluster, settings: SmokeSettings) -> None:
    _served_or_skip(cluster, NODE_POOLS_PATH, "Karpenter")

    def probe() -> list[str]:
        problems = deployment_problems(cluster, *KARPENTER_DEPLOYMENT)
        pools = cluster.list(NODE_POOLS_PATH)
        if not pools:
            problems.append("Karpenter has no NodePool: it launches no GPU node")
        problems += not_ready(pools, "NodePool")
        problems += not_ready(cluster.list(NODE_CLASSES_PATH), "EC2NodeClass")
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds),
        "Karpenter is not ready to launch GPU nodes (`kubectl describe nodepool,ec2nodeclass`, "
        "and the controller's log: `kubectl -n kube-system logs deploy/karpenter`)",
    )


def test_keda_and_its_scaled_objects_are_ready(cluster: Cluster, settings: SmokeSettings) -> None:
    _served_or_skip(cluster, SCALED_OBJECTS_PATH, "KEDA")

    def probe() -> list[str]:
        problems = [
            problem
            for deployment in KEDA_DEPLOYMENTS
            for problem in deployment_problems(cluster, KEDA_NAMESPACE, deployment)
        ]
        problem = api_service_problem(cluster, EXTERNAL_METRICS_API_SERVICE)
        problems += [problem] if problem else []
        scaled = cluster.list(SCALED_OBJECTS_PATH)
        problems += not_ready(scaled, "ScaledObject")
        for obj in scaled:
            where = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
            active = condition(obj, "Active")
            state = (active or {}).get("status")
            if state not in ("True", "False"):
                problems.append(
                    f"ScaledObject {where} cannot tell whether its trigger is active "
                    f"({describe_condition(active, 'Active')}): KEDA cannot read its metric"
                )
            elif where in settings.expect_active and state != "True":
                problems.append(
                    f"ScaledObject {where} is not active ({describe_condition(active, 'Active')}), "
                    "though --expect-active says its trigger is above its activation threshold"
                )
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds),
        "KEDA does not scale the GPU workloads (`kubectl describe scaledobject -A`, and "
        f"`kubectl -n {KEDA_NAMESPACE} logs deploy/keda-operator`)",
    )
