"""Readings of the stack's other services: Deployments, custom resources' Ready conditions,
APIServices; each problem one line naming what to look at."""

from __future__ import annotations

from tests.smoke.checks.cluster import ApiError, Cluster, SmokeError
from tests.smoke.checks.scheduling import Json, name, why_not_running

# Karpenter's and KEDA's APIs and objects (https://karpenter.sh/docs/, https://keda.sh/docs/).
NODE_POOLS_PATH = "/apis/karpenter.sh/v1/nodepools"
NODE_CLASSES_PATH = "/apis/karpenter.k8s.aws/v1/ec2nodeclasses"
KARPENTER_DEPLOYMENT = ("kube-system", "karpenter")
SCALED_OBJECTS_PATH = "/apis/keda.sh/v1alpha1/scaledobjects"
KEDA_DEPLOYMENTS = ("keda-operator", "keda-operator-metrics-apiserver")
EXTERNAL_METRICS_API_SERVICE = "v1beta1.external.metrics.k8s.io"
# CloudNativePG, where the profiler's store runs on it.
DATABASE_CLUSTERS_PATH = "/apis/postgresql.cnpg.io/v1/namespaces/{namespace}/clusters"
HEALTHY_DATABASE_PHASE = "Cluster in healthy state"


class NotServedError(SmokeError):
    """The cluster serves no such API: the component is not installed."""


def list_or_not_served(cluster: Cluster, path: str) -> list[Json]:
    try:
        return cluster.list(path)
    except ApiError as error:
        if error.status == 404:
            raise NotServedError(f"the cluster serves no {path}") from None
        raise


def condition(obj: Json, kind: str) -> Json | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return None


def describe_condition(found: Json | None, kind: str) -> str:
    if found is None:
        return f"no {kind} condition yet"
    detail = ": ".join(str(found[k]) for k in ("reason", "message") if found.get(k))
    return f"{kind}={found.get('status')}" + (f" ({detail})" if detail else "")


def not_ready(objects: list[Json], what: str) -> list[str]:
    """One problem per object whose Ready condition is not True."""
    problems = []
    for obj in objects:
        ready = condition(obj, "Ready")
        if (ready or {}).get("status") != "True":
            where = obj["metadata"].get("namespace")
            label = f"{where}/{name(obj)}" if where else name(obj)
            problems.append(f"{what} {label} is not Ready: {describe_condition(ready, 'Ready')}")
    return problems


def deployment_problems(cluster: Cluster, namespace: str, deployment: str) -> list[str]:
    """Why a Deployment is not available with every replica ready, with its pods' reasons."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}"
    found = cluster.get_or_none(path)
    if found is None:
        return [f"Deployment {namespace}/{deployment} does not exist"]
    status = found.get("status") or {}
    wanted = int((found.get("spec") or {}).get("replicas", 1))
    ready = int(status.get("readyReplicas") or 0)
    if wanted and ready >= wanted:
        return []
    selector = ((found.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    query = {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(selector.items()))}
    pods = cluster.list(f"/api/v1/namespaces/{namespace}/pods", query)
    reasons = "; ".join(f"{name(pod)}: {why_not_running(pod)}" for pod in pods) or "no pods"
    return [f"Deployment {namespace}/{deployment}: {ready} of {wanted} replicas ready ({reasons})"]


def api_service_problem(cluster: Cluster, api_service: str) -> str | None:
    found = cluster.get_or_none(f"/apis/apiregistration.k8s.io/v1/apiservices/{api_service}")
    if found is None:
        return f"APIService {api_service} does not exist"
    available = condition(found, "Available")
    if (available or {}).get("status") == "True":
        return None
    return (
        f"APIService {api_service} is not available: {describe_condition(available, 'Available')}"
    )
