"""``StandInGpuCluster``: the stand-in API server (tests/support/apiserver.py) serving a whole GPU
cluster, for the smoke suite. A TEST DOUBLE; see the package docstring for what it models."""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import requests

from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_RESOURCE
from infra.platform import GRAFANA_SERVICE, PROMETHEUS_SERVICE
from profiler_app.sinks.kubernetes import PROFILED_AT
from tests.smoke.checks.layout import (
    CUSTOM_METRICS_API,
    CUSTOM_METRICS_API_SERVICE,
    DEFAULT_DOMAIN,
    SmokeSettings,
)
from tests.support.apiserver import (
    RecordedRequest,
    StandInApiServer,
    _Handler,
    status_object,
)
from tests.support.dcgm import Gpu
from tests.support.gpu_cluster import objects
from tests.support.gpu_cluster.backends import (
    StandInDcgmExporter,
    StandInGrafana,
    custom_metric_values,
)
from tests.support.gpu_cluster.objects import Json, Workload
from tests.support.gpu_cluster.scenario import GpuNode, Scenario

KUBELET_DELAY_SECONDS = 0.1  # from scheduled to started, and from started to finished
NAMES = SmokeSettings()  # the namespaces and DaemonSets the stacks create, by default
DAEMON_SETS = NAMES.daemon_sets()
WORKLOADS = (
    *(
        Workload("DaemonSet", ref.namespace, ref.name, ref.name, on_gpu_nodes=True)
        for ref in DAEMON_SETS.values()
    ),
    Workload(
        "StatefulSet", NAMES.monitoring_namespace, "prometheus-" + PROMETHEUS_SERVICE, "prometheus"
    ),
    Workload("Deployment", NAMES.monitoring_namespace, GRAFANA_SERVICE, "grafana"),
    Workload(
        "Deployment", NAMES.monitoring_namespace, "kube-prometheus-stack-operator", "operator"
    ),
    Workload("Deployment", NAMES.monitoring_namespace, "prometheus-adapter", "prometheus-adapter"),
)
DEVICE_PLUGIN, DCGM_EXPORTER, PROFILER = (DAEMON_SETS[key].name for key in DAEMON_SETS)


@dataclass
class _Service:
    manifest: Json
    app: str | None  # app.kubernetes.io/name of the pods behind it; None: no endpoints needed
    backend: str | None  # URL of the process that answers, if any


@dataclass
class _Allocation:
    node: GpuNode
    gpus: list[int]


class _ClusterHandler(_Handler):
    """The stand-in API server's handler plus the routes of a whole cluster."""

    cluster: StandInGpuCluster  # bound by StandInGpuCluster on a subclass of its own

    def _route(self, request: RecordedRequest) -> None:
        for method, pattern, action in _ROUTES:
            if method in (request.method, "*") and (match := pattern.match(request.path)):
                action(self, request, *match.groups())
                return
        super()._route(request)

    def _send_bytes(self, code: int, content_type: str, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, answer: tuple[int, Json]) -> None:
        self._send_json(*answer)

    def list_nodes(self, request: RecordedRequest) -> None:
        self._answer(self.cluster.list_of("Node", self.cluster.nodes()))

    def list_pods(self, request: RecordedRequest, namespace: str) -> None:
        self._answer(self.cluster.list_pods(namespace, request.query))

    def create_pod(self, request: RecordedRequest, namespace: str) -> None:
        self._answer(self.cluster.create_pod(namespace, request.json()))

    def delete_pod(self, request: RecordedRequest, namespace: str, name: str) -> None:
        self._answer(self.cluster.delete_pod_answer(namespace, name))

    def pod_log(self, request: RecordedRequest, namespace: str, name: str) -> None:
        code, text = self.cluster.pod_log(namespace, name)
        if code != 200:
            self._send_status(code, "BadRequest" if code == 400 else "NotFound", text)
            return
        self._send_bytes(200, "text/plain", text.encode())

    def create_namespace(self, request: RecordedRequest) -> None:
        self._answer(self.cluster.create_namespace(request.json()))

    def delete_namespace(self, request: RecordedRequest, name: str) -> None:
        self._answer(self.cluster.delete_namespace(name))

    def list_services(self, request: RecordedRequest) -> None:
        self._answer(self.cluster.list_of("Service", self.cluster.services()))

    def get_daemon_set(self, request: RecordedRequest, namespace: str, name: str) -> None:
        self._answer(self.cluster.daemon_set(namespace, name))

    def get_api_service(self, request: RecordedRequest, name: str) -> None:
        self._answer(self.cluster.api_service(name))

    def custom_metric(
        self, request: RecordedRequest, namespace: str, pod: str, metric: str
    ) -> None:
        self._answer(self.cluster.custom_metric(namespace, pod, metric))

    def service_proxy(
        self, request: RecordedRequest, namespace: str, service: str, path: str | None
    ) -> None:
        outcome = self.cluster.proxy(request, namespace, service, path or "/")
        if isinstance(outcome, tuple):
            self._answer(outcome)
        else:
            content_type = outcome.headers.get("Content-Type", "application/octet-stream")
            self._send_bytes(outcome.status_code, content_type, outcome.content)


_Action = Callable[..., None]
_ROUTES: list[tuple[str, re.Pattern[str], _Action]] = [
    ("GET", re.compile(r"^/api/v1/nodes$"), _ClusterHandler.list_nodes),
    ("GET", re.compile(r"^/api/v1/namespaces/([^/]+)/pods$"), _ClusterHandler.list_pods),
    ("POST", re.compile(r"^/api/v1/namespaces/([^/]+)/pods$"), _ClusterHandler.create_pod),
    (
        "DELETE",
        re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$"),
        _ClusterHandler.delete_pod,
    ),
    (
        "GET",
        re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$"),
        _ClusterHandler.pod_log,
    ),
    ("POST", re.compile(r"^/api/v1/namespaces$"), _ClusterHandler.create_namespace),
    ("DELETE", re.compile(r"^/api/v1/namespaces/([^/]+)$"), _ClusterHandler.delete_namespace),
    ("GET", re.compile(r"^/api/v1/services$"), _ClusterHandler.list_services),
    (
        "GET",
        re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/daemonsets/([^/]+)$"),
        _ClusterHandler.get_daemon_set,
    ),
    (
        "GET",
        re.compile(r"^/apis/apiregistration\.k8s\.io/v1/apiservices/([^/]+)$"),
        _ClusterHandler.get_api_service,
    ),
    (
        "GET",
        re.compile(
            rf"^/apis/{re.escape(CUSTOM_METRICS_API)}/namespaces/([^/]+)/pods/([^/]+)/([^/]+)$"
        ),
        _ClusterHandler.custom_metric,
    ),
    (
        "*",
        re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/]+)/proxy(/.*)?$"),
        _ClusterHandler.service_proxy,
    ),
]


def _not_found(kind: str, name: str) -> tuple[int, Json]:
    return 404, status_object(404, "NotFound", f'{kind} "{name}" not found')


def _label_selector(text: str) -> dict[str, str]:
    """Equality-based selectors only (``a=b,c=d``), which is all the smoke suite sends."""
    pairs = [part.split("=", 1) for part in text.split(",") if part]
    return {key.rstrip("="): value.lstrip("=") for key, value in pairs}


class StandInGpuCluster(StandInApiServer):
    """The API server of a GPU cluster as ``scenario`` describes it. Use ``running_gpu_cluster``
    (tests/support/gpu_cluster/__init__.py), which also starts the backends."""

    def __init__(self, scenario: Scenario, prometheus_url: str, token: str | None = None) -> None:
        super().__init__(token)
        self.scenario = scenario
        self.prometheus_url = prometheus_url
        bound = type("BoundClusterHandler", (_ClusterHandler,), {"cluster": self})
        self._server.RequestHandlerClass = bound
        self._lock = self._state.lock
        self._namespaces = {"default", "kube-system", *NAMES.gpu_layer_namespaces()}
        self._gpu_nodes = {node.name: node for node in scenario.gpu_nodes}
        self._daemon_sets: dict[tuple[str, str], Json] = {}
        self._allocations: dict[tuple[str, str], _Allocation] = {}
        self._logs: dict[tuple[str, str], str] = {}
        self._timers: list[threading.Timer] = []
        self.exporter = StandInDcgmExporter(self.reported_gpus)
        self.grafana = StandInGrafana(scenario.grafana_admin_password)
        self._services = self._build_services()
        with self._lock:
            self._build()

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self.exporter.stop()
        self.grafana.stop()
        super().stop()

    # -- the cluster at rest ------------------------------------------------------------------

    def _commit(self, kind: str, key: Any, obj: Json, event: str | None = "ADDED") -> None:
        self._server.commit(kind, key, obj, event=event)

    def _build(self) -> None:
        for node in self.scenario.gpu_nodes:
            labels = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE} if node.labelled else {}
            taints = [taint.manifest() for taint in node.taints]
            manifest = objects.node_manifest(node.name, labels=labels, taints=taints, gpus=None)
            self._commit("nodes", node.name, manifest, event=None)
        for name in self.scenario.system_nodes:
            manifest = objects.node_manifest(name, labels={}, taints=[], gpus=None)
            self._commit("nodes", name, manifest, event=None)
        for workload in WORKLOADS:
            self._start_workload(workload)
        for node in self.scenario.gpu_nodes:
            self._publish_node_state(node)

    def _problem(self, workload: Workload, node: str) -> tuple[str, str] | None:
        for unready in self.scenario.unready:
            if unready.workload == workload.name and unready.node in (None, node):
                return unready.reason, unready.message
        return None

    def _start_workload(self, workload: Workload) -> None:
        owner_uid = objects.suffix(workload.kind, workload.namespace, workload.name, length=12)
        spec = workload.pod_spec()
        fits: list[str] = []
        reasons: list[str] = []
        for node in self._state.nodes.values():
            reason = objects.misfit(node, spec, free_gpus=0)
            (reasons if reason else fits).append(reason or node["metadata"]["name"])
        placements: list[str | None] = sorted(fits)
        if workload.kind != "DaemonSet":
            placements = placements[:1] or [None]
        pods = []
        for node_name in placements:
            problem = self._problem(workload, node_name) if node_name else None
            message = objects.unschedulable_message(reasons) if node_name is None else ""
            pod = objects.workload_pod(
                workload, owner_uid, node_name, problem=problem, unschedulable=message
            )
            self._commit("pods", (workload.namespace, pod["metadata"]["name"]), pod)
            pods.append(pod)
        if workload.kind == "DaemonSet":
            ready = sum(1 for pod in pods if _is_ready(pod))
            self._daemon_sets[workload.namespace, workload.name] = objects.daemon_set_manifest(
                workload, owner_uid, len(pods), ready
            )

    def _ready_pod_of(self, app: str, node: str | None = None) -> bool:
        return any(
            pod["metadata"]["labels"].get("app.kubernetes.io/name") == app
            and (node is None or pod["spec"].get("nodeName") == node)
            and _is_ready(pod)
            for pod in self._state.pods.values()
        )

    def _publish_node_state(self, node: GpuNode) -> None:
        """What the device plugin and the profiler write onto a node where they run."""
        stored = copy.deepcopy(self._state.nodes[node.name])
        if self._ready_pod_of(DEVICE_PLUGIN, node.name):
            stored["status"]["capacity"][GPU_RESOURCE] = str(node.gpus)
            stored["status"]["allocatable"][GPU_RESOURCE] = str(node.gpus - node.unhealthy_gpus)
        if self._ready_pod_of(PROFILER, node.name):
            domain = DEFAULT_DOMAIN
            stored["metadata"]["annotations"] = {
                f"{domain}/{PROFILED_AT}": objects.now_rfc3339(self.scenario.profile_age_seconds),
                **{f"{domain}/gpu-{index}-job-type": "idle" for index in range(node.gpus)},
            }
        self._commit("nodes", node.name, stored, event=None)

    def _build_services(self) -> dict[tuple[str, str], _Service]:
        monitoring = NAMES.monitoring_namespace
        entries = [
            (monitoring, PROMETHEUS_SERVICE, 9090, "prometheus", self.prometheus_url),
            (monitoring, GRAFANA_SERVICE, 80, "grafana", self.grafana.url),
            (monitoring, DCGM_EXPORTER, 9400, DCGM_EXPORTER, self.exporter.url),
            (monitoring, "prometheus-adapter", 443, "prometheus-adapter", None),
            (NAMES.profiler_namespace, PROFILER, 9401, PROFILER, None),
            ("default", "kubernetes", 443, None, None),
            ("kube-system", "kube-dns", 53, None, None),
        ]
        services = {
            (namespace, name): _Service(
                objects.service_manifest(namespace, name, port), app, backend
            )
            for namespace, name, port, app, backend in entries
        }
        for exposed in self.scenario.node_port_services:
            namespace, name = exposed.split("/")
            manifest = objects.service_manifest(namespace, name, 80, kind="NodePort")
            services[namespace, name] = _Service(manifest, None, None)
        return services

    # -- what the backends ask ---------------------------------------------------------------

    def reported_gpus(self) -> list[tuple[Gpu, bool]]:
        """Every GPU dcgm-exporter reports (on nodes where it runs), attributed to its pod."""
        if not self.scenario.dcgm_series:
            return []
        failures = set(self.scenario.row_remap_failures)
        with self._lock:
            holders = {
                (allocation.node.name, index): key
                for key, allocation in self._allocations.items()
                if self._state.pods.get(key, {}).get("status", {}).get("phase") == "Running"
                for index in allocation.gpus
            }
            return [
                (
                    objects.gpu(node, index, holders.get((node.name, index))),
                    (node.name, index) in failures,
                )
                for node in self.scenario.gpu_nodes
                if self._ready_pod_of(DCGM_EXPORTER, node.name)
                for index in range(node.gpus)
            ]

    # -- reads --------------------------------------------------------------------------------

    def nodes(self) -> list[Json]:
        with self._lock:
            return [copy.deepcopy(node) for node in self._state.nodes.values()]

    def services(self) -> list[Json]:
        return [copy.deepcopy(service.manifest) for service in self._services.values()]

    @staticmethod
    def list_of(kind: str, items: list[Json]) -> tuple[int, Json]:
        return 200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items}

    def list_pods(self, namespace: str, query: dict[str, str]) -> tuple[int, Json]:
        wanted = _label_selector(query.get("labelSelector", ""))
        with self._lock:
            items = [
                copy.deepcopy(pod)
                for (pod_namespace, _), pod in self._state.pods.items()
                if pod_namespace == namespace
                and all(pod["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
        return self.list_of("Pod", items)

    def daemon_set(self, namespace: str, name: str) -> tuple[int, Json]:
        found = self._daemon_sets.get((namespace, name))
        if found is None:
            return _not_found("daemonsets.apps", name)
        return 200, copy.deepcopy(found)

    def api_service(self, name: str) -> tuple[int, Json]:
        if name != CUSTOM_METRICS_API_SERVICE:
            return _not_found("apiservices.apiregistration.k8s.io", name)
        with self._lock:
            available = self._ready_pod_of("prometheus-adapter")
        condition = {"type": "Available", "status": "True", "reason": "Passed"}
        if not available:
            condition = {
                "type": "Available",
                "status": "False",
                "reason": "MissingEndpoints",
                "message": 'endpoints for service/prometheus-adapter in "monitoring" have no '
                'addresses with port name "https"',
            }
        manifest = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "status": {"conditions": [condition]},
        }
        return 200, manifest

    def custom_metric(self, namespace: str, pod: str, metric: str) -> tuple[int, Json]:
        with self._lock:
            available = self._ready_pod_of("prometheus-adapter")
            pods = [
                name
                for (pod_namespace, name) in self._state.pods
                if pod_namespace == namespace and pod in ("*", name)
            ]
        if not available:
            message = "the server is currently unable to handle the request"
            return 503, status_object(503, "ServiceUnavailable", message)
        values = custom_metric_values(self.prometheus_url, metric, namespace, pods)
        if not values:
            message = f"the server could not find the metric {metric} for pods {pod}"
            return 404, status_object(404, "NotFound", message)
        items = [
            {
                "describedObject": {
                    "kind": "Pod",
                    "namespace": namespace,
                    "name": name,
                    "apiVersion": "/v1",
                },
                "metricName": metric,
                "timestamp": objects.now_rfc3339(),
                "value": _quantity(value),
            }
            for name, value in sorted(values.items())
        ]
        return 200, {
            "kind": "MetricValueList",
            "apiVersion": CUSTOM_METRICS_API,
            "metadata": {},
            "items": items,
        }

    def proxy(
        self, request: RecordedRequest, namespace: str, service_port: str, path: str
    ) -> tuple[int, Json] | requests.Response:
        """The API server's service proxy: forward to the service's backend process when it
        has ready endpoints. The API server does not forward the caller's Authorization."""
        name = service_port.split(":", maxsplit=1)[0]
        service = self._services.get((namespace, name))
        if service is None:
            return _not_found("services", name)
        with self._lock:
            has_endpoints = service.app is not None and self._ready_pod_of(service.app)
        if not has_endpoints:
            message = f'no endpoints available for service "{name}"'
            return 503, status_object(503, "ServiceUnavailable", message)
        if service.backend is None:
            message = f"error trying to reach service: dial tcp {name}: connect: connection refused"
            return 503, status_object(503, "ServiceUnavailable", message)
        headers = {"Content-Type": request.content_type} if request.content_type else {}
        query = f"?{urlencode(request.query)}" if request.query else ""
        return requests.request(
            request.method,
            f"{service.backend}{path}{query}",
            data=request.body or None,
            headers=headers,
            timeout=30,
        )

    # -- test pods -----------------------------------------------------------------------------

    def create_namespace(self, manifest: Json) -> tuple[int, Json]:
        name = manifest.get("metadata", {}).get("name", "")
        with self._lock:
            if name in self._namespaces:
                message = f'namespaces "{name}" already exists'
                return 409, status_object(409, "AlreadyExists", message)
            self._namespaces.add(name)
        return 201, {**manifest, "status": {"phase": "Active"}}

    def delete_namespace(self, name: str) -> tuple[int, Json]:
        with self._lock:
            if name not in self._namespaces:
                return _not_found("namespaces", name)
            self._namespaces.discard(name)
            for key in [key for key in self._state.pods if key[0] == name]:
                self._remove_pod(key)
        return 200, {
            "kind": "Namespace",
            "metadata": {"name": name},
            "status": {"phase": "Terminating"},
        }

    def _remove_pod(self, key: tuple[str, str]) -> Json:
        pod = self._state.pods[key]
        self._commit("pods", key, pod, event="DELETED")
        self._allocations.pop(key, None)
        self._logs.pop(key, None)
        return pod

    def delete_pod_answer(self, namespace: str, name: str) -> tuple[int, Json]:
        with self._lock:
            if (namespace, name) not in self._state.pods:
                return _not_found("pods", name)
            return 200, copy.deepcopy(self._remove_pod((namespace, name)))

    def pod_log(self, namespace: str, name: str) -> tuple[int, str]:
        with self._lock:
            if (namespace, name) not in self._state.pods:
                return 404, f'pods "{name}" not found'
            if (namespace, name) not in self._logs:
                return 400, f'container "main" in pod "{name}" is waiting to start'
            return 200, self._logs[namespace, name]

    def create_pod(self, namespace: str, manifest: Json) -> tuple[int, Json]:
        name = manifest.get("metadata", {}).get("name")
        containers = manifest.get("spec", {}).get("containers") or []
        with self._lock:
            if namespace not in self._namespaces:
                return _not_found("namespaces", namespace)
            if not name:
                return 422, status_object(422, "Invalid", "metadata.name: Required value")
            if (namespace, name) in self._state.pods:
                return 409, status_object(409, "AlreadyExists", f'pods "{name}" already exists')
            problem = _pod_problem(containers)
            if problem:
                return 422, status_object(422, "Invalid", f'Pod "{name}" is invalid: {problem}')
            pod = copy.deepcopy(manifest)
            pod["metadata"] |= {"namespace": namespace, "uid": str(uuid.uuid4())}
            pod["metadata"]["creationTimestamp"] = objects.now_rfc3339()
            pod["status"] = self._schedule(namespace, name, pod)
            self._commit("pods", (namespace, name), pod)
            return 201, copy.deepcopy(pod)

    def _free_gpus(self, node: GpuNode) -> list[int]:
        taken = {
            index
            for key, allocation in self._allocations.items()
            if allocation.node is node
            and self._state.pods.get(key, {}).get("status", {}).get("phase")
            in ("Pending", "Running")
            for index in allocation.gpus
        }
        if not self._ready_pod_of(DEVICE_PLUGIN, node.name):
            return []
        return [i for i in range(node.gpus - node.unhealthy_gpus) if i not in taken]

    def _schedule(self, namespace: str, name: str, pod: Json) -> Json:
        """Bind the pod once, at creation (the stand-in never retries), or leave it Pending."""
        spec = pod["spec"]
        reasons = []
        for node in sorted(self._state.nodes.values(), key=lambda node: node["metadata"]["name"]):
            node_name = node["metadata"]["name"]
            gpu_node = self._gpu_nodes.get(node_name)
            free = self._free_gpus(gpu_node) if gpu_node else []
            reason = objects.misfit(node, spec, free_gpus=len(free))
            if reason:
                reasons.append(reason)
                continue
            spec["nodeName"] = node_name
            if gpu_node is not None:
                wanted = objects.gpus_requested(spec)
                self._allocations[namespace, name] = _Allocation(gpu_node, free[:wanted])
            self._later(self._start_pod, namespace, name)
            return {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": spec["containers"][0]["name"],
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                ],
            }
        return {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": objects.unschedulable_message(reasons),
                }
            ],
        }

    def _later(self, action: Callable[..., None], *args: Any) -> None:
        timer = threading.Timer(KUBELET_DELAY_SECONDS, action, args)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _start_pod(self, namespace: str, name: str) -> None:
        """The kubelet: start the container, then let it finish or keep running."""
        key = (namespace, name)
        with self._lock:
            pod = self._state.pods.get(key)
            if pod is None:
                return
            container = pod["spec"]["containers"][0]
            node = self._gpu_nodes.get(pod["spec"]["nodeName"])
            allocation = self._allocations.get(key)
            visible: list[Gpu] = []
            if node is not None:
                allocated = [objects.gpu(node, i) for i in (allocation.gpus if allocation else [])]
                visible = objects.visible_gpus(self.scenario, node, container, allocated)
            log, exit_code = objects.run_container(container, visible)
            self._logs[key] = log
            running = {"running": {"startedAt": objects.now_rfc3339()}}
            self._set_container_state(key, "Running", running, ready=True)
        if exit_code is not None:
            ended = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if exit_code == 0 else "Error",
                }
            }
            phase = "Succeeded" if exit_code == 0 else "Failed"
            self._later(self._finish_pod, key, phase, ended)

    def _finish_pod(self, key: tuple[str, str], phase: str, state: Json) -> None:
        with self._lock:
            if key in self._state.pods:
                self._set_container_state(key, phase, state, ready=False)

    def _set_container_state(
        self, key: tuple[str, str], phase: str, state: Json, *, ready: bool
    ) -> None:
        pod = copy.deepcopy(self._state.pods[key])
        status = pod["status"]
        status["phase"] = phase
        status["containerStatuses"][0] |= {"state": state, "ready": ready}
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": str(ready)},
        ]
        self._commit("pods", key, pod, event="MODIFIED")


def _is_ready(pod: Json) -> bool:
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in pod.get("status", {}).get("conditions") or []
    )


def _pod_problem(containers: list[Json]) -> str | None:
    """What the real API server's validation (or this stand-in's model) rejects."""
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
        if not objects.is_modelled(container):
            return f"{where}.command: the stand-in models only `nvidia-smi -L` and `sleep`"
    return None


def _quantity(value: float) -> str:
    """A Kubernetes quantity, as prometheus-adapter writes metric values."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"
