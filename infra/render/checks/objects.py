"""What several checks read off the graph: the pods a workload makes, their containers, the
Services of the cluster (operators' and the platform's included), the keys of a Secret or
ConfigMap."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infra.render.cnpg import cnpg_pods, cnpg_services
from infra.render.graph import K8sObject, ObjectGraph

MONITORING_GROUP = "monitoring.coreos.com/v1"
POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(frozen=True)
class Workload:
    """Pods an object makes: its pod spec and labels (operator CRs make a StatefulSet's pods)."""

    owner: K8sObject
    spec: Mapping[str, Any]
    labels: Mapping[str, str]

    @property
    def every_node(self) -> bool:
        return self.owner.kind == "DaemonSet"


def workloads(graph: ObjectGraph) -> Iterator[Workload]:
    for obj in graph.objects:
        if obj.kind == "Pod":
            yield Workload(obj, obj.manifest.get("spec") or {}, obj.labels)
        elif obj.kind in POD_TEMPLATE_PATHS:
            template = _pod_template(obj)
            labels = (template.get("metadata") or {}).get("labels") or {}
            yield Workload(obj, template.get("spec") or {}, labels)
        elif obj.api_version == MONITORING_GROUP and obj.kind in ("Prometheus", "Alertmanager"):
            yield Workload(obj, obj.manifest.get("spec") or {}, _operator_pod_labels(obj))
    for pods in cnpg_pods(graph):
        yield Workload(pods.owner, pods.spec, pods.labels)


def _pod_template(obj: K8sObject) -> Mapping[str, Any]:
    """The pod template of a workload kind; empty for other kinds."""
    template: Any = obj.manifest if obj.kind in POD_TEMPLATE_PATHS else None
    for key in POD_TEMPLATE_PATHS.get(obj.kind, ()):
        template = (template or {}).get(key)
    return template or {}


def _operator_pod_labels(obj: K8sObject) -> dict[str, str]:
    """The labels prometheus-operator gives the pods of a Prometheus or Alertmanager."""
    spec = obj.manifest.get("spec") or {}
    kind = obj.kind.lower()
    return {
        **((spec.get("podMetadata") or {}).get("labels") or {}),
        "app.kubernetes.io/name": kind,
        "app.kubernetes.io/instance": obj.name,
        "app.kubernetes.io/managed-by": "prometheus-operator",
        "operator.prometheus.io/name": obj.name,
        kind: obj.name,
    }


def pod_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A pod spec's init containers and containers."""
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


def services(graph: ObjectGraph) -> list[dict[str, Any]]:
    """Services in the graph, the platform's, and those operators create."""
    found = [o.manifest for o in graph.of_kind("Service")]
    found += graph.platform.services
    found += cnpg_services(graph)
    for obj in graph.objects:
        if obj.api_version == MONITORING_GROUP and obj.kind in ("Prometheus", "Alertmanager"):
            port = 9090 if obj.kind == "Prometheus" else 9093
            found.append(
                _service(f"{obj.kind.lower()}-operated", obj.namespace, {}, [("web", port)])
            )
        for container in pod_containers(pod_spec(obj)):
            for arg in container.get("args") or ():
                # prometheus-operator keeps a selector-less Service of the kubelets up to date.
                if str(arg).startswith("--kubelet-service="):
                    namespace, _, name = str(arg).split("=", 1)[1].partition("/")
                    labels = {"app.kubernetes.io/name": "kubelet", "k8s-app": "kubelet"}
                    ports = [("https-metrics", 10250), ("http-metrics", 10255), ("cadvisor", 4194)]
                    found.append(_service(name, namespace, labels, ports))
    return found


def _service(
    name: str, namespace: str | None, labels: dict[str, str], ports: list[tuple[str, int]]
) -> dict[str, Any]:
    return {
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"ports": [{"name": n, "port": p} for n, p in ports]},
    }


def pod_spec(obj: K8sObject) -> Mapping[str, Any]:
    """The pod spec of a workload kind's template; empty for other kinds."""
    spec: Mapping[str, Any] = _pod_template(obj).get("spec") or {}
    return spec


def data_keys(obj: K8sObject) -> set[str]:
    """The keys a Secret or ConfigMap holds."""
    manifest = obj.manifest
    return {
        *(manifest.get("data") or {}),
        *(manifest.get("stringData") or {}),
        *(manifest.get("binaryData") or {}),
    }
