"""Kubernetes objects of the stand-in GPU cluster, and the stand-in's scheduler and container
model. Shapes follow the real API's (the fields the smoke suite and ``kubectl`` read); values
follow the scenario.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infra.gpu import GPU_RESOURCE, gpu_node_selector, gpu_tolerations
from tests.smoke.checks.pods import CUDA_CHECK_SOURCE
from tests.smoke.checks.volumes import VOLUME_CHECK_SOURCE
from tests.support.dcgm import Gpu
from tests.support.fake_cuda import run_cuda_program
from tests.support.gpu_cluster.scenario import GpuNode, Keda, Scenario, StoreDatabase
from tests.support.gpu_cluster.sharing import requested as sharing_requested

# What the volume check prints when it wrote its file and read it back.
VOLUME_CHECK_OUTPUT = "wrote and read back /data/smoke-check\n"

Json = dict[str, Any]
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


def now_rfc3339(offset_seconds: float = 0.0, now: float | None = None) -> str:
    current = datetime.now(UTC).timestamp() if now is None else now
    moment = datetime.fromtimestamp(current - offset_seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def suffix(*parts: str, length: int = 5) -> str:
    """A stable pod-name suffix, like the controllers' random ones."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


@dataclass(frozen=True)
class Workload:
    """A controller of the GPU layer and the pods it keeps: one per eligible node (DaemonSet) or
    one in all (Deployment, StatefulSet)."""

    kind: str
    namespace: str
    name: str
    app: str  # its pods' app.kubernetes.io/name
    on_gpu_nodes: bool = False  # the GPU nodeSelector and tolerations of infra/gpu.py

    def pod_spec(self) -> Json:
        spec: Json = {"containers": [{"name": self.app, "image": f"stand-in/{self.app}"}]}
        if self.on_gpu_nodes:
            spec |= {"nodeSelector": gpu_node_selector(), "tolerations": gpu_tolerations()}
        return spec


def node_manifest(name: str, *, labels: Json, taints: list[Json]) -> Json:
    """A node as it joins: no GPU resource until a device plugin registers one."""
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": suffix("node", name, length=12),
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels},
            "annotations": {},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
            ],
        },
    }


def _container_status(name: str, *, ready: bool, waiting: tuple[str, str] | None) -> Json:
    state: Json = {"running": {"startedAt": now_rfc3339()}}
    if waiting is not None:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    return {"name": name, "ready": ready, "restartCount": 0, "state": state}


def workload_pod(
    workload: Workload,
    owner_uid: str,
    node: str | None,
    *,
    problem: tuple[str, str] | None = None,
    unschedulable: str = "",
) -> Json:
    """A controller's pod: running and ready on ``node``, stuck as ``problem`` (reason, message)
    says, or Pending with the scheduler's ``unschedulable`` message when ``node`` is None."""
    pod_name = f"{workload.name}-{suffix(workload.name, node or '')}"
    ready = node is not None and problem is None
    spec = workload.pod_spec()
    status: Json = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
    if node is None:
        status["phase"] = "Pending"
        status["conditions"].append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        )
    else:
        spec["nodeName"] = node
        status["containerStatuses"] = [
            _container_status(spec["containers"][0]["name"], ready=ready, waiting=problem)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": workload.namespace,
            "uid": suffix("pod", workload.namespace, pod_name, length=12),
            "labels": {"app.kubernetes.io/name": workload.app},
            "annotations": {},
            "ownerReferences": [{"kind": workload.kind, "name": workload.name, "uid": owner_uid}],
        },
        "spec": spec,
        "status": status,
    }


def daemon_set_manifest(workload: Workload, uid: str, scheduled: int, ready: int) -> Json:
    selector = {"app.kubernetes.io/name": workload.app}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": workload.name,
            "namespace": workload.namespace,
            "uid": uid,
            "generation": 1,
        },
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": workload.pod_spec()},
        },
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": scheduled,
            "currentNumberScheduled": scheduled,
            "updatedNumberScheduled": scheduled,
            "numberReady": ready,
            "numberAvailable": ready,
            "numberUnavailable": scheduled - ready,
        },
    }


def deployment_manifest(workload: Workload, ready: int) -> Json:
    """A one-replica Deployment whose status counts its ready pods."""
    selector = {"app.kubernetes.io/name": workload.app}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": workload.name, "namespace": workload.namespace, "generation": 1},
        "spec": {"replicas": 1, "selector": {"matchLabels": selector}},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": ready},
    }


def scaled_object_manifest(keda: Keda) -> Json:
    """The example workload's ScaledObject, with KEDA's Ready and Active conditions."""
    ready = {"type": "Ready", "status": "True", "reason": "ScaledObjectReady", "message": ""}
    if keda.scaled_object_not_ready is not None:
        reason, message = keda.scaled_object_not_ready
        ready = {"type": "Ready", "status": "False", "reason": reason, "message": message}
    active = {"type": "Active", "status": keda.active, "reason": "ScalerNotActive"}
    if keda.active == "True":
        active["reason"] = "ScalerActive"
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "llm-server", "namespace": "inference"},
        "spec": {"scaleTargetRef": {"name": "llm-server"}},
        "status": {"conditions": [ready, active]},
    }


def storage_class_manifest(name: str) -> Json:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "ebs.csi.aws.com",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def database_manifest(namespace: str, store: StoreDatabase) -> Json:
    """The profiler's CloudNativePG cluster, healthy or with an instance down."""
    phase = (
        "Cluster in healthy state"
        if store.healthy
        else "Waiting for the instances to become active"
    )
    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "gpu-profiler-store", "namespace": namespace},
        "spec": {"instances": 2},
        "status": {"phase": phase, "readyInstances": 2 if store.healthy else 1},
    }


def service_manifest(namespace: str, name: str, port: int, kind: str = "ClusterIP") -> Json:
    port_entry: Json = {"name": "http", "port": port, "protocol": "TCP"}
    if kind != "ClusterIP":
        port_entry["nodePort"] = 30000 + port % 2768
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": kind, "ports": [port_entry]},
    }


# -- the scheduler ----------------------------------------------------------------------------


def _tolerated(taint: Json, tolerations: list[Json]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint["effect"]):
            continue
        if toleration.get("operator") == "Exists":
            if toleration.get("key") in (None, "", taint["key"]):
                return True
        elif toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def misfit(
    node: Json, pod_spec: Json, free_gpus: int, free_shared: Mapping[str, int] | None = None
) -> str | None:
    """Why the scheduler would not place the pod on ``node``, in its words; None if it fits.
    ``free_shared``: free MIG devices and shared GPUs by resource (sharing.py)."""
    node_labels = node["metadata"]["labels"]
    selector = pod_spec.get("nodeSelector") or {}
    if any(node_labels.get(key) != value for key, value in selector.items()):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in node.get("spec", {}).get("taints") or []:
        if taint["effect"] in SCHEDULING_EFFECTS and not _tolerated(
            taint, pod_spec.get("tolerations") or []
        ):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    if not _node_affinity_matches(pod_spec, node_labels):
        return "node(s) didn't match Pod's node affinity/selector"
    if gpus_requested(pod_spec) > free_gpus:
        return f"Insufficient {GPU_RESOURCE}"
    for resource, count in sharing_requested(pod_spec).items():
        if count > (free_shared or {}).get(resource, 0):
            return f"Insufficient {resource}"
    return None


def _expression_matches(expression: Json, labels: Json) -> bool:
    value = labels.get(expression["key"])
    values = expression.get("values") or []
    return {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }.get(expression["operator"], False)


def _node_affinity_matches(pod_spec: Json, labels: Json) -> bool:
    """Required node affinity: one of its terms matches every expression."""
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
        for term in terms
    )


def _selects(selector: Json, labels: Json) -> bool:
    return all(
        labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items()
    )


def layout_misfit(node: str, pod: Json, placed: list[Json], domains: list[str]) -> str | None:
    """Required pod affinity on the hostname, and topology spread (``DoNotSchedule``) over the
    hostname, as the scheduler filters them; ``placed`` are the bound pods of the namespace,
    ``domains`` the nodes that pass the pod's node selection."""
    labels = pod["metadata"].get("labels") or {}
    spec = pod["spec"]
    affinity = (spec.get("affinity") or {}).get("podAffinity") or {}
    for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        matching = [
            p for p in placed if _selects(term["labelSelector"], p["metadata"].get("labels") or {})
        ]
        if matching and not any(p["spec"].get("nodeName") == node for p in matching):
            return "node(s) didn't match pod affinity rules"
        if not matching and not _selects(term["labelSelector"], labels):
            return "node(s) didn't match pod affinity rules"
    for constraint in spec.get("topologySpreadConstraints") or []:
        if constraint.get("whenUnsatisfiable") != "DoNotSchedule":
            continue
        counts = Counter(
            p["spec"].get("nodeName")
            for p in placed
            if _selects(constraint["labelSelector"], p["metadata"].get("labels") or {})
        )
        lowest = min((counts.get(domain, 0) for domain in domains), default=0)
        if counts.get(node, 0) + 1 - lowest > int(constraint["maxSkew"]):
            return "node(s) didn't match pod topology spread constraints"
    return None


def unschedulable_message(reasons: list[str]) -> str:
    """The scheduler's FailedScheduling message for these per-node reasons."""
    counts = Counter(reasons)
    listed = ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
    return f"0/{len(reasons)} nodes are available: {listed}."


def gpus_requested(pod_spec: Json) -> int:
    return sum(
        int((container.get("resources") or {}).get("limits", {}).get(GPU_RESOURCE, 0))
        for container in pod_spec.get("containers") or []
    )


# -- containers -------------------------------------------------------------------------------


def gpu(node: GpuNode, index: int, holder: tuple[str, str] | None = None) -> Gpu:
    """GPU ``index`` of ``node`` as NVML names it; ``holder`` (namespace, pod) if allocated."""
    namespace, pod = holder if holder else (None, None)
    return Gpu(
        node.name,
        index,
        model_name=node.model,
        namespace=namespace,
        pod=pod,
        container="main" if holder else None,
    )


TRAINING_COMMAND = re.compile(r"\btrain\b")  # a trial's workload (TrainingModel)
_KEEPS_RUNNING = re.compile(r"\bsleep\b|\btrain\b")


def command_line(container: Json) -> str:
    return " ".join([*(container.get("command") or []), *(container.get("args") or [])])


def _argv(container: Json) -> list[str]:
    return [*(container.get("command") or []), *(container.get("args") or [])]


def is_cuda_program(container: Json) -> bool:
    """The smoke suite's CUDA program (cuda_check.py run as ``python3 -c <its source>``)."""
    argv = _argv(container)
    return argv[:2] == ["python3", "-c"] and len(argv) > 2 and argv[2] == CUDA_CHECK_SOURCE


def is_volume_program(container: Json) -> bool:
    """The smoke suite's volume check (volumes.py)."""
    argv = _argv(container)
    return argv[:2] == ["python3", "-c"] and len(argv) > 2 and argv[2] == VOLUME_CHECK_SOURCE


def is_gpu_listing(container: Json) -> bool:
    """``nvidia-smi -L`` (the MIG and time-slicing checks)."""
    return not is_cuda_program(container) and "nvidia-smi -L" in command_line(container)


def is_modelled(container: Json) -> bool:
    return (
        is_cuda_program(container)
        or is_volume_program(container)
        or is_gpu_listing(container)
        or bool(_KEEPS_RUNNING.search(command_line(container)))
    )


def run_container(
    container: Json, visible: list[Gpu] | None, scenario: Scenario, listing: str | None = None
) -> tuple[str, int | None]:
    """What a container prints and its exit code (None: it keeps running) in this model.

    The smoke suite's CUDA program really runs, against the stand-in driver
    (tests/support/fake_cuda.py) with the GPUs the container was handed (``visible``; None: no
    GPU, so no driver library), failing where the scenario's CUDA fails; with ``--hold`` it keeps
    running until the pod is deleted. The volume check prints what it wrote and read back. A
    training script (``train``, the trials' workloads) or a ``sleep`` keeps running.
    ``nvidia-smi -L`` lists the GPUs the container can see (``listing`` where it was given MIG
    devices or shared GPUs), or says none were found (exit 6, as the real tool does).
    """
    if is_volume_program(container):
        return VOLUME_CHECK_OUTPUT, 0
    if is_gpu_listing(container):
        return _nvidia_smi_listing(container, visible, listing)
    if not is_cuda_program(container):
        return "", None if _KEEPS_RUNNING.search(command_line(container)) else 0
    arguments = _argv(container)[3:]
    holds = "--hold" in arguments
    if holds:
        index = arguments.index("--hold")
        arguments = arguments[:index] + arguments[index + 2 :]
    output, code = run_cuda_program(
        CUDA_CHECK_SOURCE,
        arguments,
        uuids=None if visible is None else [device.uuid for device in visible],
        failure=scenario.cuda_failure,
        peer_access=scenario.peer_access,
    )
    return output, None if holds else code


def _nvidia_smi_listing(
    container: Json, visible: list[Gpu] | None, listing: str | None
) -> tuple[str, int | None]:
    output, code = "", 0
    if listing:
        output = listing
    elif visible:
        output = "".join(
            f"GPU {index}: {device.model_name} (UUID: {device.uuid})\n"
            for index, device in enumerate(visible)
        )
    else:
        output, code = "No devices were found\n", 6
    return output, None if _KEEPS_RUNNING.search(command_line(container)) else code


def visible_gpus(
    scenario: Scenario, node: GpuNode, container: Json, allocated: list[Gpu]
) -> list[Gpu] | None:
    """Allocated GPUs; or every GPU of the node for a container that asks through the
    environment, where the scenario's runtime honours that; None: the runtime hands it none."""
    if allocated:
        return allocated
    asks = any(
        variable.get("name") == "NVIDIA_VISIBLE_DEVICES" and variable.get("value") == "all"
        for variable in container.get("env") or []
    )
    if asks and scenario.runtime_honours_visible_devices_env:
        return [gpu(node, index) for index in range(node.gpus)]
    return None


def is_ready(pod: Json) -> bool:
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in pod.get("status", {}).get("conditions") or []
    )


def ready_pod_of(pods: list[Json], app: str, node: str | None = None) -> bool:
    """Whether a ready pod labelled app.kubernetes.io/name=``app`` runs (on ``node``)."""
    return any(
        pod["metadata"].get("labels", {}).get("app.kubernetes.io/name") == app
        and (node is None or pod["spec"].get("nodeName") == node)
        and is_ready(pod)
        for pod in pods
    )


def invalid_pod(containers: list[Json]) -> str | None:
    """What the real API server's validation (or this stand-in's model) rejects in a pod."""
    if not containers:
        return "spec.containers: Required value"
    for index, container in enumerate(containers):
        where = f"spec.containers[{index}]"
        if not container.get("name") or not container.get("image"):
            return f"{where}: name and image are required"
        resources = container.get("resources") or {}
        if GPU_RESOURCE in (resources.get("requests") or {}) and GPU_RESOURCE not in (
            resources.get("limits") or {}
        ):
            return (
                f"{where}.resources.limits: Required value: Limit must be set for non "
                "overcommitable resources"
            )
        if not is_modelled(container):
            return (
                f"{where}.command: the stand-in models only the smoke suite's programs, a "
                "training script (`train`), `nvidia-smi -L` and `sleep`"
            )
    return None


def quantity(value: float) -> str:
    """A Kubernetes quantity, as prometheus-adapter writes metric values."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"
