"""``StandInGpuCluster``: the stand-in API server of tests/support/apiserver/, extended by
subclassing to serve a whole GPU cluster for the smoke suite. A TEST DOUBLE; the package
docstring says what it models."""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import requests

from tests.smoke.checks.layout import CUSTOM_METRICS_API, CUSTOM_METRICS_API_SERVICE, KEDA_NAMESPACE
from tests.smoke.checks.services import EXTERNAL_METRICS_API_SERVICE
from tests.support.apiserver.handler import Handler
from tests.support.apiserver.objects import status_object
from tests.support.apiserver.server import StandInApiServer
from tests.support.apiserver.state import RecordedRequest
from tests.support.dcgm import Gpu
from tests.support.gpu_cluster import controllers, objects
from tests.support.gpu_cluster.backends import (
    StandInDcgmExporter,
    StandInGrafana,
    custom_metric_values,
)
from tests.support.gpu_cluster.batch import BatchControllers
from tests.support.gpu_cluster.controllers import (
    ADAPTER,
    DCGM_EXPORTER,
    KEDA_METRICS_SERVER,
    NAMES,
)
from tests.support.gpu_cluster.karpenter import API_VERSION as KARPENTER_API
from tests.support.gpu_cluster.karpenter import NODE_CLASS_API, StandInKarpenter
from tests.support.gpu_cluster.kubelet import PodLifecycle, Reply, not_found
from tests.support.gpu_cluster.objects import Json
from tests.support.gpu_cluster.scenario import Scenario

_NAME = "([^/]+)"
# (method or "*", path, the StandInGpuCluster method that answers with the path's groups)
ROUTES = [
    ("GET", r"/api/v1/nodes", "list_nodes"),
    ("GET", rf"/api/v1/namespaces/{_NAME}/pods", "list_pods"),
    ("POST", rf"/api/v1/namespaces/{_NAME}/pods", "create_pod"),
    ("DELETE", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}", "delete_pod"),
    ("GET", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}/log", "pod_log"),
    ("POST", r"/api/v1/namespaces", "create_namespace"),
    ("DELETE", rf"/api/v1/namespaces/{_NAME}", "delete_namespace"),
    ("GET", r"/api/v1/services", "list_services"),
    ("GET", rf"/apis/apps/v1/namespaces/{_NAME}/daemonsets/{_NAME}", "daemon_set"),
    ("GET", rf"/apis/apiregistration\.k8s\.io/v1/apiservices/{_NAME}", "api_service"),
    (
        "GET",
        rf"/apis/{re.escape(CUSTOM_METRICS_API)}/namespaces/{_NAME}/pods/{_NAME}/{_NAME}",
        "custom_metric",
    ),
    ("*", rf"/api/v1/namespaces/{_NAME}/services/{_NAME}/proxy(/.*)?", "proxy"),
    ("GET", rf"/apis/{re.escape(KARPENTER_API)}/nodeclaims", "list_node_claims"),
    ("*", rf"/apis/batch/v1/namespaces/{_NAME}/(jobs)(?:/{_NAME})?", "batch_objects"),
    (
        "*",
        rf"/apis/kubeflow\.org/v1/namespaces/{_NAME}/(pytorchjobs)(?:/{_NAME})?",
        "batch_objects",
    ),
    ("*", rf"/api/v1/namespaces/{_NAME}/(configmaps|resourcequotas)(?:/{_NAME})?", "batch_objects"),
    ("*", rf"/apis/scheduling\.k8s\.io/v1/()(priorityclasses)(?:/{_NAME})?", "batch_objects"),
    (
        "*",
        rf"/apis/coordination\.k8s\.io/v1/namespaces/{_NAME}/(leases)(?:/{_NAME})?",
        "batch_objects",
    ),
    ("GET", rf"/apis/{re.escape(KARPENTER_API)}/nodeclaims/{_NAME}", "node_claim"),
    ("GET", rf"/apis/{re.escape(KARPENTER_API)}/nodepools", "list_node_pools"),
    ("GET", rf"/apis/{re.escape(NODE_CLASS_API)}/ec2nodeclasses", "list_node_classes"),
    ("GET", rf"/apis/apps/v1/namespaces/{_NAME}/deployments/{_NAME}", "deployment"),
    ("GET", r"/apis/keda\.sh/v1alpha1/scaledobjects", "list_scaled_objects"),
    ("GET", r"/apis/storage\.k8s\.io/v1/storageclasses", "list_storage_classes"),
    ("POST", rf"/api/v1/namespaces/{_NAME}/persistentvolumeclaims", "create_claim"),
    ("GET", rf"/api/v1/namespaces/{_NAME}/persistentvolumeclaims/{_NAME}", "claim"),
    ("GET", rf"/api/v1/namespaces/{_NAME}/events", "list_events"),
    ("GET", rf"/apis/postgresql\.cnpg\.io/v1/namespaces/{_NAME}/clusters", "list_databases"),
]
_ROUTES = [(method, re.compile(f"^{path}$"), name) for method, path, name in ROUTES]


class _ClusterHandler(Handler):
    """The stand-in API server's handler, answering ROUTES first."""

    cluster: StandInGpuCluster  # set on a per-server subclass by StandInGpuCluster

    def _route(self, request: RecordedRequest) -> None:
        if self.cluster.clock() < self.cluster.down_until:
            message = "the API server is unavailable (injected outage)"
            self._send_status(503, "ServiceUnavailable", message)
            return
        self.cluster.reconcile()  # controllers catch up with the clock before every answer
        for method, pattern, name in _ROUTES:
            if method in (request.method, "*") and (match := pattern.match(request.path)):
                self._reply(getattr(self.cluster, name)(request, *match.groups()))
                return
        super()._route(request)

    def _reply(self, reply: Reply | tuple[int, bytes, str]) -> None:
        """(code, JSON object), (code, text), or (code, bytes, content type)."""
        if len(reply) == 3:
            code, data, content_type = reply
        elif isinstance(reply[1], dict):
            self._send_json(*reply)
            return
        else:
            code, data, content_type = reply[0], str(reply[1]).encode(), "text/plain"
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _label_selector(text: str) -> dict[str, str]:
    """Equality-based selectors only (``a=b,c=d``), which is all the smoke suite sends."""
    pairs = [part.split("=", 1) for part in text.split(",") if part]
    return {key.rstrip("="): value.lstrip("=") for key, value in pairs}


def _listing(kind: str, items: list[Json]) -> Reply:
    return 200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items}


class StandInGpuCluster(StandInApiServer):
    """The API server of a GPU cluster as ``scenario`` describes it, with its dcgm-exporter and
    Grafana; ``prometheus_url`` is the Prometheus its service proxy reaches. Use
    ``running_gpu_cluster`` (the package's __init__), which starts that Prometheus too."""

    def __init__(
        self,
        scenario: Scenario,
        prometheus_url: str,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(token)
        self.clock = clock  # controllers, kubelets and deadlines run on it (a test may fake it)
        self.down_until = 0.0  # on the clock: every request answers 503 before then (an outage)
        handler = type("BoundClusterHandler", (_ClusterHandler,), {"cluster": self})
        self._server.RequestHandlerClass = handler  # socketserver's documented attribute
        self.scenario = scenario
        self.prometheus_url = prometheus_url
        self.gpu_nodes = {node.name: node for node in scenario.gpu_nodes}
        self.namespaces = {
            "default",
            "kube-system",
            KEDA_NAMESPACE,
            *NAMES.gpu_layer_namespaces(),
        }
        self.pods = PodLifecycle(self)
        self.batch = BatchControllers(self)
        self._store_errors = 0
        self.exporter = StandInDcgmExporter(
            self.reported_gpus, self.gpu_values, self.profiler_metrics
        )
        self.grafana = StandInGrafana(scenario.grafana_admin_password)
        backends = {
            "prometheus": prometheus_url,
            "grafana": self.grafana.url,
            DCGM_EXPORTER: self.exporter.url,
        }
        self._services = controllers.services(scenario, backends)
        self.karpenter = StandInKarpenter(self, scenario.karpenter) if scenario.karpenter else None
        with self.lock:
            self._bring_up()

    @property
    def state(self) -> Any:
        """The base server's store (nodes, pods, watch history); hold ``lock`` to use it."""
        return self._state

    @property
    def lock(self) -> threading.Condition:
        return self._state.lock

    def commit(self, kind: str, key: Any, obj: Json, event: str | None) -> None:
        self._state.commit(kind, key, obj, event=event)

    def start(self) -> None:
        super().start()
        self._ticking = threading.Event()
        self._ticker = threading.Thread(target=self._tick_until_stopped, daemon=True)
        self._ticker.start()
        if self.karpenter is not None:
            self.karpenter.start()

    def _tick_until_stopped(self) -> None:
        while not self._ticking.wait(0.02):
            self.reconcile()

    def reconcile(self) -> None:
        """Kubelets and controllers act on what is due on the clock."""
        self.pods.tick()
        with self.lock:
            self.batch.reconcile()

    def stop(self) -> None:
        if hasattr(self, "_ticking"):
            self._ticking.set()
        if self.karpenter is not None:
            self.karpenter.stop()
        self.pods.stop()
        self.exporter.stop()
        self.grafana.stop()
        super().stop()

    def _bring_up(self) -> None:
        nodes = controllers.nodes(self.scenario)
        pods, daemon_sets = controllers.workloads(self.scenario, nodes)
        for pod in pods:
            self.commit(
                "pods", (pod["metadata"]["namespace"], pod["metadata"]["name"]), pod, "ADDED"
            )
        for name, joined in nodes.items():
            gpu_node = self.gpu_nodes.get(name)
            node = joined
            if gpu_node is not None:
                node = controllers.published_node(joined, gpu_node, pods, self.scenario)
            self.commit("nodes", name, node, event=None)
        self._daemon_sets = {
            (ds["metadata"]["namespace"], ds["metadata"]["name"]): ds for ds in daemon_sets
        }

    def _ready(self, app: str, node: str | None = None) -> bool:
        return objects.ready_pod_of(list(self._state.pods.values()), app, node)

    def profiler_metrics(self) -> list[str]:
        """The profiler's store error counter, rising at every scrape while its writes fail."""
        store = self.scenario.store
        if store is None:
            return []
        if store.failing_writes:
            self._store_errors += 1
        return [
            "# TYPE gpu_profiler_errors_total counter",
            f'gpu_profiler_errors_total{{kind="store"}} {self._store_errors}',
        ]

    def reported_gpus(self) -> list[tuple[Gpu, bool]]:
        """What dcgm-exporter reports: every GPU of the nodes where it runs, attributed to the
        pod holding it, and whether its row remapping failed."""
        if not self.scenario.dcgm_series:
            return []
        failures = set(self.scenario.row_remap_failures)
        with self.lock:
            holders = self.pods.holders()
            if self.scenario.misattributed:
                holders = {
                    (node, (index + 1) % self.gpu_nodes[node].gpus): pod
                    for (node, index), pod in holders.items()
                }
            return [
                (
                    objects.gpu(node, index, holders.get((node.name, index))),
                    (node.name, index) in failures,
                )
                for node in self.scenario.gpu_nodes
                if self._ready(DCGM_EXPORTER, node.name)
                for index in range(node.gpus)
            ]

    # -- routes (see ROUTES) -------------------------------------------------------------------

    def list_nodes(self, request: RecordedRequest) -> Reply:
        with self.lock:
            return _listing("Node", copy.deepcopy(list(self._state.nodes.values())))

    def list_pods(self, request: RecordedRequest, namespace: str) -> Reply:
        wanted = _label_selector(request.query.get("labelSelector", ""))
        with self.lock:
            items = [
                copy.deepcopy(pod)
                for (pod_namespace, _), pod in self._state.pods.items()
                if pod_namespace == namespace
                and all(pod["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
            ]
        return _listing("Pod", items)

    def create_pod(self, request: RecordedRequest, namespace: str) -> Reply:
        with self.lock:
            return self.pods.create(namespace, request.json())

    def delete_pod(self, request: RecordedRequest, namespace: str, name: str) -> Reply:
        options = request.json() if request.body else {}
        grace = options.get("gracePeriodSeconds", request.query.get("gracePeriodSeconds"))
        with self.lock:
            return self.pods.delete((namespace, name), None if grace is None else int(grace))

    def pod_log(self, request: RecordedRequest, namespace: str, name: str) -> Reply:
        since = request.query.get("sinceTime")
        stamp = objects.parse_rfc3339(since) if since else None
        timestamps = request.query.get("timestamps", "").lower() == "true"
        with self.lock:
            return self.pods.log((namespace, name), timestamps=timestamps, since=stamp)

    def batch_objects(
        self, request: RecordedRequest, namespace: str, plural: str, name: str | None
    ) -> Reply:
        """Jobs, PyTorchJobs, ConfigMaps, ResourceQuotas and PriorityClasses (batch.py)."""
        with self.lock:
            if request.method == "POST" and name is None:
                return self.batch.create(plural, namespace, request.json())
            if request.method == "GET" and name is None:
                selector = _label_selector(request.query.get("labelSelector", ""))
                return self.batch.list(plural, namespace, selector)
            if request.method == "GET":
                return self.batch.get(plural, namespace, name or "")
            if request.method == "PUT" and name is not None:
                return self.batch.update(plural, namespace, name, request.json())
            if request.method == "DELETE" and name is not None:
                options = request.json() if request.body else {}
                policy = options.get("propagationPolicy") or request.query.get("propagationPolicy")
                return self.batch.delete(plural, namespace, name, policy)
        message = f"{request.method} is not supported here"
        return 405, status_object(405, "MethodNotAllowed", message)

    def gpu_values(self, gpu: Any) -> dict[str, float]:
        """A training pod's GPU: utilisation and SM activity as a square wave of its step
        period on the cluster's clock (busy 60 % of each step), as dcgm-exporter would see."""
        with self.lock:
            holder = (gpu.namespace, gpu.pod)
            shape = self.pods.step_period(holder) if holder in self.state.pods else None
        if shape is None:
            return {}
        start, period = shape
        busy = (self.clock() - start) % period < 0.6 * period
        return {
            "DCGM_FI_DEV_GPU_UTIL": 97.0 if busy else 12.0,
            "DCGM_FI_PROF_SM_ACTIVE": 0.85 if busy else 0.08,
        }

    def create_namespace(self, request: RecordedRequest) -> Reply:
        manifest = request.json()
        name = manifest.get("metadata", {}).get("name", "")
        with self.lock:
            if name in self.namespaces:
                message = f'namespaces "{name}" already exists'
                return 409, status_object(409, "AlreadyExists", message)
            self.namespaces.add(name)
        return 201, {**manifest, "status": {"phase": "Active"}}

    def delete_namespace(self, request: RecordedRequest, name: str) -> Reply:
        with self.lock:
            if name not in self.namespaces:
                return not_found("namespaces", name)
            self.namespaces.discard(name)
            for key in [key for key in self._state.pods if key[0] == name]:
                self.pods.delete(key)
        return 200, {
            "kind": "Namespace",
            "metadata": {"name": name},
            "status": {"phase": "Terminating"},
        }

    def list_services(self, request: RecordedRequest) -> Reply:
        return _listing("Service", [copy.deepcopy(s.manifest) for s in self._services.values()])

    def daemon_set(self, request: RecordedRequest, namespace: str, name: str) -> Reply:
        found = self._daemon_sets.get((namespace, name))
        return (200, copy.deepcopy(found)) if found else not_found("daemonsets.apps", name)

    def api_service(self, request: RecordedRequest, name: str) -> Reply:
        backend = {
            CUSTOM_METRICS_API_SERVICE: ADAPTER,
            EXTERNAL_METRICS_API_SERVICE: KEDA_METRICS_SERVER if self.scenario.keda else None,
        }.get(name)
        if backend is None:
            return not_found("apiservices.apiregistration.k8s.io", name)
        with self.lock:
            available = self._ready(backend)
        condition = {"type": "Available", "status": "True", "reason": "Passed"}
        if not available:
            condition = {
                "type": "Available",
                "status": "False",
                "reason": "MissingEndpoints",
                "message": f"endpoints for service/{backend} have no addresses with port name "
                '"https"',
            }
        return 200, {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "status": {"conditions": [condition]},
        }

    def custom_metric(
        self, request: RecordedRequest, namespace: str, pod: str, metric: str
    ) -> Reply:
        """prometheus-adapter behind the aggregation layer (backends.custom_metric_values)."""
        with self.lock:
            available = self._ready(ADAPTER)
            pods = [
                name for (ns, name) in self._state.pods if ns == namespace and pod in ("*", name)
            ]
        if not available:
            message = "the server is currently unable to handle the request"
            return 503, status_object(503, "ServiceUnavailable", message)
        values = custom_metric_values(self.prometheus_url, metric, namespace, pods)
        if not values:
            message = f"the server could not find the metric {metric} for pods {pod}"
            return 404, status_object(404, "NotFound", message)
        described = {"kind": "Pod", "namespace": namespace, "apiVersion": "/v1"}
        items = [
            {
                "describedObject": {**described, "name": name},
                "metricName": metric,
                "timestamp": objects.now_rfc3339(),
                "value": objects.quantity(value),
            }
            for name, value in sorted(values.items())
        ]
        return 200, {"kind": "MetricValueList", "apiVersion": CUSTOM_METRICS_API, "items": items}

    def proxy(
        self, request: RecordedRequest, namespace: str, service_port: str, path: str | None
    ) -> Reply | tuple[int, bytes, str]:
        """The service proxy: forward to the local process answering for the Service when a
        ready pod backs it. Like the real one, it does not pass on the caller's Authorization."""
        name = service_port.split(":", maxsplit=1)[0]
        service = self._services.get((namespace, name))
        if service is None:
            return not_found("services", name)
        with self.lock:
            has_endpoints = service.app is not None and self._ready(service.app)
        if not has_endpoints:
            message = f'no endpoints available for service "{name}"'
            return 503, status_object(503, "ServiceUnavailable", message)
        if service.backend is None:
            message = f"error trying to reach service: dial tcp {name}: connect: connection refused"
            return 503, status_object(503, "ServiceUnavailable", message)
        headers = {"Content-Type": request.content_type} if request.content_type else {}
        query = f"?{urlencode(request.query)}" if request.query else ""
        answer = requests.request(
            request.method,
            f"{service.backend}{path or '/'}{query}",
            data=request.body or None,
            headers=headers,
            timeout=30,
        )
        content_type = answer.headers.get("Content-Type", "application/octet-stream")
        return answer.status_code, answer.content, content_type

    def list_node_claims(self, request: RecordedRequest) -> Reply:
        if self.karpenter is None:
            return _not_served()
        with self.lock:
            return self.karpenter.list_node_claims()

    def node_claim(self, request: RecordedRequest, name: str) -> Reply:
        if self.karpenter is None:
            return _not_served()
        with self.lock:
            return self.karpenter.node_claim(name)

    def list_node_pools(self, request: RecordedRequest) -> Reply:
        return self.karpenter.list_node_pools() if self.karpenter else _not_served()

    def list_node_classes(self, request: RecordedRequest) -> Reply:
        return self.karpenter.list_node_classes() if self.karpenter else _not_served()

    def deployment(self, request: RecordedRequest, namespace: str, name: str) -> Reply:
        """A Deployment of the scenario's workloads, its status from its pods."""
        workload = next(
            (
                w
                for w in controllers.workloads_of(self.scenario)
                if (w.kind, w.namespace, w.name) == ("Deployment", namespace, name)
            ),
            None,
        )
        if workload is None:
            return not_found("deployments.apps", name)
        with self.lock:
            ready = sum(
                1
                for (ns, _), pod in self._state.pods.items()
                if ns == namespace
                and pod["metadata"].get("labels", {}).get("app.kubernetes.io/name") == workload.app
                and objects.is_ready(pod)
            )
        return 200, objects.deployment_manifest(workload, ready)

    def list_scaled_objects(self, request: RecordedRequest) -> Reply:
        keda = self.scenario.keda
        if keda is None:
            return _not_served()
        return _listing("ScaledObject", [objects.scaled_object_manifest(keda)])

    def list_storage_classes(self, request: RecordedRequest) -> Reply:
        name = self.scenario.storage.default_class
        return _listing("StorageClass", [objects.storage_class_manifest(name)] if name else [])

    def create_claim(self, request: RecordedRequest, namespace: str) -> Reply:
        with self.lock:
            return self.pods.create_claim(namespace, request.json())

    def claim(self, request: RecordedRequest, namespace: str, name: str) -> Reply:
        with self.lock:
            found = self.pods.claims.get((namespace, name))
        if found is None:
            return not_found("persistentvolumeclaims", name)
        return 200, copy.deepcopy(found)

    def list_events(self, request: RecordedRequest, namespace: str) -> Reply:
        """The namespace's Events; ``fieldSelector=involvedObject.name=NAME`` narrows them."""
        selector = request.query.get("fieldSelector", "")
        named = selector.split("=", 1)[1] if selector.startswith("involvedObject.name=") else None
        with self.lock:
            events = self.pods.claim_events(namespace) + [
                copy.deepcopy(e)
                for e in self.batch.state.events
                if e["involvedObject"].get("namespace") == namespace
            ]
        if named is not None:
            events = [e for e in events if e["involvedObject"].get("name") == named]
        return _listing("Event", events)

    def list_databases(self, request: RecordedRequest, namespace: str) -> Reply:
        store = self.scenario.store
        if store is None:
            return _not_served()
        items = (
            [objects.database_manifest(namespace, store)]
            if namespace == NAMES.profiler_namespace
            else []
        )
        return _listing("Cluster", items)


def _not_served() -> Reply:
    """What the real API server answers for a group no CRD serves."""
    return 404, status_object(404, "NotFound", "the server could not find the requested resource")
