"""Checks of a stack's whole object graph: what must hold for `pulumi up` to converge and work.

Each check returns findings, one line each, naming the object and what to fix; none means pass.

- ``values``: every value a release passes is one its chart has (Helm ignores the others);
- ``schema``: every object valid for the cluster (see validity.py);
- ``namespaces``: every namespaced object in a namespace that exists or that the stack creates;
- ``monitoring``: every ServiceMonitor, PodMonitor and PrometheusRule selected by a Prometheus;
  every ServiceMonitor endpoint on a Service with that port, selecting pods whose metrics are
  reachable, with scrapeTimeout <= interval; every ``job="..."`` in a rule names a scraped job;
- ``references``: every in-cluster URL (HTTP or PostgreSQL) and Service reference handed to a
  component resolves to a Service and port, every role binding to a role; every Secret and
  ConfigMap the stack's own workloads and database objects name exists with the keys they read;
- ``grafana``: dashboards and data sources carry the labels Grafana's sidecars watch, in a
  namespace they watch; the Secret Grafana's credentials come from exists with its keys; every
  environment variable a data source names and every certificate file it reads is Grafana's;
- ``scheduling``: every workload (Helm hook Jobs and operator-made pods included: Prometheus',
  the database's instances and pooler) fits a node pool of the stack, with nodes to run on
  (Karpenter NodePools launch theirs); DaemonSets aimed at GPU nodes cover every GPU pool, and
  NVIDIA's device plugin runs in each; every volume claim (the database's, Prometheus') names a
  StorageClass the stack creates or the cluster has (``--assume-storage-class``), or there is a
  default class;
- ``conflicts``: no two objects share kind, namespace and name (two releases' APIServices);
- ``scalers``: every ScaledObject and HPA scales a workload of the stack; Prometheus triggers name
  a server (resolved by ``references``) and a query;
- ``admission``: every ServiceAccount the project lets write has a denying admission policy
  (admission_checks.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from infra.gpu import GPU_NODE_LABEL_KEY, GPU_RESOURCE
from infra.render.admission_checks import admission_findings
from infra.render.charts import ignored_values
from infra.render.cnpg import (
    cnpg_claims,
    cnpg_pods,
    cnpg_secret_refs,
    cnpg_services,
    pooler_cluster_findings,
    verified_names,
)
from infra.render.graph import K8sObject, ObjectGraph
from infra.render.validity import invalid_objects
from infra.scheduling import (
    NodePool,
    PodPlacement,
    fitting_pools,
    label_selector_matches,
    misfit,
)

MONITORING_GROUP = "monitoring.coreos.com/v1"
KEDA_GROUP = "keda.sh/"
DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"  # nvcr.io/nvidia/k8s-device-plugin
# Prometheus' own defaults, which prometheus-operator keeps when the CR sets none.
DEFAULT_SCRAPE_INTERVAL = "30s"
DEFAULT_SCRAPE_TIMEOUT = "10s"
URL = re.compile(r"\bhttps?://([A-Za-z0-9][A-Za-z0-9.-]*)(?::(\d+))?")
POSTGRESQL_URL = re.compile(
    r"\bpostgres(?:ql)?(?:\+\w+)?://(?:[^@/\s]*@)?([A-Za-z0-9][A-Za-z0-9.-]*)(?::(\d+))?"
)
POSTGRESQL_PORT = 5432
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
GRAFANA_ENV = re.compile(r"\$__env\{(\w+)\}")
# The host of a PostgreSQL URL that verifies the server's name.
VERIFY_FULL_HOST = re.compile(
    r"\bpostgres(?:ql)?(?:\+\w+)?://(?:[^@/\s]*@)?([A-Za-z0-9][A-Za-z0-9.-]*)[^\s]*"
    r"[?&]sslmode=verify-full\b"
)
JOB_MATCHER = re.compile(r'\bjob\s*=\s*"([^"]+)"')
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# Labels that feature discovery (NFD, NVIDIA's GPU feature discovery) puts on nodes at run time: a
# DaemonSet that needs one runs only where an operator opted in, so fitting no pool is expected.
DISCOVERED_LABEL_PREFIXES = ("feature.node.kubernetes.io/", "nvidia.com/mps.", "nvidia.com/mig.")
POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def seconds(duration: str) -> float:
    """A Prometheus duration ("1m30s") in seconds."""
    parts = DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(number) * DURATION_SECONDS[unit] for number, unit in parts)


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


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]


# -- namespaces ---------------------------------------------------------------------------------


def existing_namespaces(graph: ObjectGraph, assumed: frozenset[str] = frozenset()) -> set[str]:
    return {
        *graph.platform.namespaces,
        *assumed,
        *(ns.name for ns in graph.of_kind("Namespace")),
    }


def missing_namespaces(graph: ObjectGraph, assumed: frozenset[str] = frozenset()) -> list[str]:
    existing = existing_namespaces(graph, assumed)
    scopes = graph.crd_scopes()
    return [
        f"{obj}: namespace {obj.namespace or '(none)'} is neither created by the stack nor built "
        f"in; create it, or say it exists (render --assume-namespace)"
        for obj in graph.objects
        if graph.is_namespaced(obj, scopes) and obj.namespace not in existing
    ]


def _namespace_labels(graph: ObjectGraph, name: str) -> dict[str, str]:
    namespace = graph.find("Namespace", name)
    labels = dict(namespace.labels) if namespace else {}
    labels["kubernetes.io/metadata.name"] = name
    return labels


# -- monitoring ---------------------------------------------------------------------------------


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
        for container in _containers(_pod_spec(obj)):
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


def _pod_spec(obj: K8sObject) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = _pod_template(obj).get("spec") or {}
    return spec


def _selected(graph: ObjectGraph, prometheus: K8sObject, obj: K8sObject) -> bool:
    field = {
        "ServiceMonitor": "serviceMonitor",
        "PodMonitor": "podMonitor",
        "PrometheusRule": "rule",
    }[obj.kind]
    spec = prometheus.manifest.get("spec") or {}
    if not label_selector_matches(spec.get(f"{field}Selector"), obj.labels):
        return False
    namespace_selector = spec.get(f"{field}NamespaceSelector")
    if namespace_selector is None:  # only Prometheus' own namespace
        return obj.namespace == prometheus.namespace
    return label_selector_matches(namespace_selector, _namespace_labels(graph, obj.namespace or ""))


def _pods_behind(
    graph: ObjectGraph, service: Mapping[str, Any]
) -> tuple[list[Workload], list[str], list[str]]:
    """What a Service selects: workloads of the graph, reachable and unreachable platform pods."""
    selector = (service.get("spec") or {}).get("selector")
    namespace = service["metadata"].get("namespace")
    if not selector:
        return [], ["endpoints it is given"], []
    match = {"matchLabels": selector}
    ours = [
        w
        for w in workloads(graph)
        if w.owner.namespace == namespace and label_selector_matches(match, w.labels)
    ]
    reachable: list[str] = []
    unreachable: list[str] = []
    for pods in graph.platform.pods:
        if pods.namespace == namespace and label_selector_matches(match, pods.labels):
            (reachable if pods.metrics_reachable else unreachable).append(pods.what)
    return ours, reachable, unreachable


def _monitor_services(
    graph: ObjectGraph, monitor: K8sObject, all_services: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    spec = monitor.manifest.get("spec") or {}
    scope = spec.get("namespaceSelector") or {}
    names = scope.get("matchNames")
    return [
        s
        for s in all_services
        if (scope.get("any") or s["metadata"].get("namespace") in (names or [monitor.namespace]))
        and label_selector_matches(spec.get("selector") or {}, s["metadata"].get("labels") or {})
    ]


def _job_name(monitor: K8sObject, service: Mapping[str, Any]) -> str:
    job_label = (monitor.manifest.get("spec") or {}).get("jobLabel")
    labels = service["metadata"].get("labels") or {}
    if job_label and job_label in labels:
        return str(labels[job_label])
    return str(service["metadata"]["name"])


def _endpoint_findings(
    monitor: K8sObject, endpoint: Mapping[str, Any], prometheus_spec: Mapping[str, Any]
) -> Iterator[str]:
    interval = (
        endpoint.get("interval") or prometheus_spec.get("scrapeInterval") or DEFAULT_SCRAPE_INTERVAL
    )
    timeout = (
        endpoint.get("scrapeTimeout")
        or prometheus_spec.get("scrapeTimeout")
        or DEFAULT_SCRAPE_TIMEOUT
    )
    if seconds(timeout) > seconds(interval):
        yield (
            f"{monitor}: endpoint {endpoint.get('port')} has scrapeTimeout {timeout} > interval "
            f"{interval}; prometheus-operator drops it"
        )


def _service_monitor_findings(
    graph: ObjectGraph,
    monitor: K8sObject,
    prometheus_spec: Mapping[str, Any],
    all_services: list[dict[str, Any]],
    jobs: set[str],
) -> Iterator[str]:
    matched = _monitor_services(graph, monitor, all_services)
    if not matched:
        yield f"{monitor}: selects no Service"
    for endpoint in (monitor.manifest.get("spec") or {}).get("endpoints") or ():
        yield from _endpoint_findings(monitor, endpoint, prometheus_spec)
        port = endpoint.get("port")
        named = {p.get("name") for s in matched for p in s["spec"].get("ports", ())}
        if matched and port and port not in named:
            yield f"{monitor}: no selected Service has a port named {port}"
    for service in matched:
        jobs.add(_job_name(monitor, service))
        ours, reachable, unreachable = _pods_behind(graph, service)
        if ours or reachable:
            continue
        where = f"{service['metadata'].get('namespace')}/{service['metadata']['name']}"
        if unreachable:
            yield (
                f"{monitor}: Service {where} selects {', '.join(unreachable)}, whose metrics are "
                f"not reachable from Prometheus on {graph.platform.name}; disable it"
            )
        else:
            yield f"{monitor}: Service {where} selects no pods"


def _pod_monitor_findings(graph: ObjectGraph, monitor: K8sObject) -> Iterator[str]:
    """A PodMonitor selects pods of the stack, and each endpoint's port is one of theirs."""
    spec = monitor.manifest.get("spec") or {}
    scope = spec.get("namespaceSelector") or {}
    names = scope.get("matchNames") or [monitor.namespace]
    pods = [
        w
        for w in workloads(graph)
        if (scope.get("any") or w.owner.namespace in names)
        and label_selector_matches(spec.get("selector") or {}, w.labels)
    ]
    if not pods:
        yield f"{monitor}: selects no pods"
        return
    ports = {p.get("name") for w in pods for c in _containers(w.spec) for p in c.get("ports") or ()}
    for endpoint in spec.get("podMetricsEndpoints") or ():
        port = endpoint.get("port")
        if port and port not in ports:
            yield f"{monitor}: no selected pod has a port named {port}"


def _rule_job_findings(graph: ObjectGraph, jobs: set[str]) -> Iterator[str]:
    for rule in graph.of_kind("PrometheusRule"):
        for group in (rule.manifest.get("spec") or {}).get("groups") or ():
            for entry in group.get("rules") or ():
                for job in JOB_MATCHER.findall(str(entry.get("expr", ""))):
                    if job not in jobs:
                        name = entry.get("alert") or entry.get("record")
                        yield f"{rule}: {name} queries job {job!r}, which nothing scrapes"


def monitoring_findings(graph: ObjectGraph) -> list[str]:
    findings = []
    prometheuses = [p for p in graph.of_kind("Prometheus") if p.api_version == MONITORING_GROUP]
    all_services = services(graph)
    jobs: set[str] = set()
    for obj in graph.of_kind("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        selecting = [p for p in prometheuses if _selected(graph, p, obj)]
        if not selecting:
            findings.append(f"{obj}: no Prometheus selects it (labels {obj.labels})")
        if obj.kind == "PodMonitor":
            jobs.add(f"{obj.namespace}/{obj.name}")
            findings.extend(_pod_monitor_findings(graph, obj))
        elif obj.kind == "ServiceMonitor":
            spec = (selecting[0].manifest.get("spec") or {}) if selecting else {}
            findings.extend(_service_monitor_findings(graph, obj, spec, all_services, jobs))
    findings.extend(_rule_job_findings(graph, jobs))
    return findings


# -- references ---------------------------------------------------------------------------------


def _handed_strings(obj: K8sObject) -> Iterator[tuple[str, str]]:
    """``(where, text)`` of what a component is told: container env, args, command, ConfigMaps,
    KEDA triggers' metadata."""
    if obj.kind == "ConfigMap":
        for key, text in (obj.manifest.get("data") or {}).items():
            yield f"data {key}", str(text)
    if obj.api_version.startswith(KEDA_GROUP):
        for index, scaler in enumerate((obj.manifest.get("spec") or {}).get("triggers") or ()):
            for key, text in (scaler.get("metadata") or {}).items():
                yield f"trigger {index} {key}", str(text)
    for container in _containers(_pod_spec(obj)):
        name = container.get("name")
        for env in container.get("env") or ():
            if "value" in env:
                yield f"container {name} env {env['name']}", str(env["value"])
        for text in [*(container.get("args") or ()), *(container.get("command") or ())]:
            yield f"container {name} args", str(text)


def _certificate_name_findings(graph: ObjectGraph, host: str) -> Iterator[str]:
    """``sslmode=verify-full`` to a database of the stack: ``host`` must be one of the names of
    the certificate the operator issues, or every connection fails verification."""
    names = verified_names(graph, host)
    if names is not None and host not in names:
        yield (
            f"sslmode=verify-full to {host}, which is not among the server certificate's names "
            f"({', '.join(names) or 'no Cluster'}); add it to certificates.serverAltDNSNames"
        )


def _urls(text: str) -> Iterator[tuple[str, str, int]]:
    """``(host, port or "", default port)`` of every HTTP(S) and PostgreSQL URL in ``text``."""
    for match in URL.finditer(text):
        yield match[1], match[2] or "", 443 if match[0].startswith("https") else 80
    for match in POSTGRESQL_URL.finditer(text):
        yield match[1], match[2] or "", POSTGRESQL_PORT


def _resolve(
    host: str, port: int, namespaces: set[str], all_services: list[dict[str, Any]]
) -> str | None:
    """Why ``host:port`` is not a Service port, or None.

    In-cluster names are ``<service>.<namespace>[.svc[.cluster.local]]``; other hosts (a bare
    name, or one whose second label is no namespace of the cluster) are taken as external.
    """
    bare = host.rstrip(".").removesuffix(".cluster.local").removesuffix(".svc")
    service_domain = bare != host.rstrip(".")
    labels = bare.split(".")
    if len(labels) != 2:
        return "not <service>.<namespace>.svc" if service_domain else None
    name, namespace = labels
    if namespace not in namespaces:
        return f"namespace {namespace} does not exist" if service_domain else None
    service = next(
        (
            s
            for s in all_services
            if s["metadata"]["name"] == name and s["metadata"].get("namespace") == namespace
        ),
        None,
    )
    if service is None:
        return f"no Service {name} in namespace {namespace}"
    if port not in {p.get("port") for p in service["spec"].get("ports", ())}:
        return f"Service {namespace}/{name} has no port {port}"
    return None


def _service_refs(obj: K8sObject) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(where, {name, namespace, port})`` of Service references in API objects."""
    spec = obj.manifest.get("spec") or {}
    if obj.kind == "APIService" and spec.get("service"):
        yield "spec.service", spec["service"]
    for hook in obj.manifest.get("webhooks") or ():
        service = (hook.get("clientConfig") or {}).get("service")
        if service:
            yield f"webhook {hook.get('name')}", service
    if obj.kind == "Prometheus":
        for target in (spec.get("alerting") or {}).get("alertmanagers") or ():
            yield (
                "alerting.alertmanagers",
                {**target, "namespace": target.get("namespace") or obj.namespace},
            )


# Roles every cluster has (the API server's bootstrap policy), besides those named "system:...".
BOOTSTRAP_ROLES = frozenset(
    {
        ("ClusterRole", None, "cluster-admin"),
        ("ClusterRole", None, "admin"),
        ("ClusterRole", None, "edit"),
        ("ClusterRole", None, "view"),
        ("Role", "kube-system", "extension-apiserver-authentication-reader"),
    }
)


def _role_ref_findings(graph: ObjectGraph) -> Iterator[str]:
    """Every RoleBinding and ClusterRoleBinding refers to a role that exists."""
    for binding in graph.of_kind("RoleBinding", "ClusterRoleBinding"):
        ref = binding.manifest.get("roleRef") or {}
        name, kind = str(ref.get("name")), str(ref.get("kind"))
        namespace = binding.namespace if kind == "Role" else None
        if name.startswith("system:") or (kind, namespace, name) in BOOTSTRAP_ROLES:
            continue
        if graph.find(kind, name, namespace) is None:
            yield f"{binding}: roleRef {kind} {name} does not exist"


def _keys(obj: K8sObject) -> set[str]:
    manifest = obj.manifest
    return {
        *(manifest.get("data") or {}),
        *(manifest.get("stringData") or {}),
        *(manifest.get("binaryData") or {}),
    }


def _named_objects(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """``(where, kind, name, keys)`` of the Secrets and ConfigMaps a pod spec reads (not those
    marked optional)."""
    for container in _containers(spec):
        for env in container.get("env") or ():
            source = env.get("valueFrom") or {}
            for field, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                ref = source.get(field)
                if ref and not ref.get("optional"):
                    where = f"container {container.get('name')} env {env.get('name')}"
                    yield where, kind, str(ref.get("name")), (str(ref.get("key")),)
    for volume in spec.get("volumes") or ():
        for field, kind, name_key in (
            ("secret", "Secret", "secretName"),
            ("configMap", "ConfigMap", "name"),
        ):
            source = volume.get(field)
            if source and not source.get("optional"):
                keys = tuple(str(item["key"]) for item in source.get("items") or ())
                yield f"volume {volume.get('name')}", kind, str(source.get(name_key)), keys


def _object_ref_findings(graph: ObjectGraph) -> Iterator[str]:
    """The stack's own workloads and database objects name Secrets and ConfigMaps that exist with
    the keys they read (charts' own references are the charts' business)."""
    wanted: list[tuple[K8sObject, str, str, str, tuple[str, ...]]] = [
        (w.owner, where, kind, name, keys)
        for w in workloads(graph)
        if not w.owner.source.startswith("helm/")
        for where, kind, name, keys in _named_objects(w.spec)
    ]
    wanted += [
        (obj, where, "Secret", name, keys) for obj, where, name, keys in cnpg_secret_refs(graph)
    ]
    for owner, where, kind, name, keys in wanted:
        found = graph.find(kind, name, owner.namespace)
        if found is None:
            yield f"{owner}: {where}: no {kind} {owner.namespace}/{name}"
            continue
        missing = sorted(set(keys) - _keys(found))
        if missing:
            yield f"{owner}: {where}: {kind} {name} has no key {', '.join(missing)}"
    yield from pooler_cluster_findings(graph)


def reference_findings(graph: ObjectGraph, assumed: frozenset[str] = frozenset()) -> list[str]:
    findings = list(_role_ref_findings(graph))
    findings.extend(_object_ref_findings(graph))
    all_services = services(graph)
    namespaces = existing_namespaces(graph, assumed)
    for obj in graph.objects:
        for where, text in _handed_strings(obj):
            for host, port, default in _urls(text):
                problem = _resolve(host, int(port or default), namespaces, all_services)
                if problem:
                    findings.append(f"{obj}: {where}: {host}:{port or default}: {problem}")
            for host in VERIFY_FULL_HOST.findall(text):
                findings.extend(
                    f"{obj}: {where}: {line}" for line in _certificate_name_findings(graph, host)
                )
        for where, ref in _service_refs(obj):
            service = next(
                (
                    s
                    for s in all_services
                    if s["metadata"]["name"] == ref.get("name")
                    and s["metadata"].get("namespace") == ref.get("namespace")
                ),
                None,
            )
            port = ref.get("port", 443)
            ports = {
                p.get(key)
                for p in (service or {}).get("spec", {}).get("ports", ())
                for key in ("name", "port")
            }
            if service is None or port not in ports:
                target = f"{ref.get('namespace')}/{ref.get('name')}"
                findings.append(f"{obj}: {where}: no Service {target} port {port}")
    return findings


# -- grafana ------------------------------------------------------------------------------------


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or ()}


def grafana_findings(graph: ObjectGraph) -> list[str]:
    findings = []
    for grafana in graph.of_kind("Deployment"):
        containers = {c.get("name"): c for c in _containers(_pod_spec(grafana))}
        if "grafana" not in containers:
            continue
        sidecar = _env(containers.get("grafana-sc-dashboard") or {})
        if not sidecar:
            findings.append(f"{grafana}: no dashboard sidecar, so no dashboard is loaded")
        label, value = sidecar.get("LABEL"), sidecar.get("LABEL_VALUE")
        watched = str(sidecar.get("NAMESPACE") or grafana.namespace)
        for config_map in graph.of_kind("ConfigMap"):
            if not _holds_dashboard(config_map) or not sidecar:
                continue
            if label not in config_map.labels or (value and config_map.labels[label] != value):
                findings.append(
                    f"{config_map}: a dashboard without the sidecar's label {label}={value}"
                )
            elif watched != "ALL" and config_map.namespace not in watched.split(","):
                findings.append(
                    f"{config_map}: a dashboard outside the namespaces Grafana watches ({watched})"
                )
        for container in containers.values():
            for name, source in _env(container).items():
                ref = (source or {}).get("secretKeyRef") if isinstance(source, dict) else None
                if ref and not ref.get("optional"):
                    findings.extend(_secret_key_finding(graph, grafana, container, name, ref))
        findings.extend(_datasource_findings(graph, grafana, containers))
    return findings


def _datasources(config_map: K8sObject) -> list[Mapping[str, Any]]:
    """The data sources a provisioning ConfigMap defines (none if it is no provisioning file)."""
    found: list[Mapping[str, Any]] = []
    for text in (config_map.manifest.get("data") or {}).values():
        try:
            document = yaml.safe_load(str(text))
        except yaml.YAMLError:
            continue
        if isinstance(document, dict):
            found += [d for d in document.get("datasources") or () if isinstance(d, dict)]
    return found


def _mounted_file(
    graph: ObjectGraph, pod: K8sObject, container: Mapping[str, Any], path: str
) -> str | None:
    """Why ``path`` is no file of a ConfigMap or Secret mounted in ``container``, or None."""
    volumes = {v.get("name"): v for v in _pod_spec(pod).get("volumes") or ()}
    for mount in container.get("volumeMounts") or ():
        folder = str(mount.get("mountPath", "")).rstrip("/")
        if not path.startswith(f"{folder}/"):
            continue
        key = path[len(folder) + 1 :]
        volume = volumes.get(mount.get("name")) or {}
        for field, kind, name_key in (
            ("configMap", "ConfigMap", "name"),
            ("secret", "Secret", "secretName"),
        ):
            source = volume.get(field)
            if source is None:
                continue
            found = graph.find(kind, str(source.get(name_key)), pod.namespace)
            if found is None:
                return f"no {kind} {pod.namespace}/{source.get(name_key)} (mounted at {folder})"
            return None if key in _keys(found) else f"{kind} {found.name} has no key {key}"
    return "no ConfigMap or Secret is mounted there"


def _datasource_findings(
    graph: ObjectGraph, grafana: K8sObject, containers: Mapping[Any, Mapping[str, Any]]
) -> Iterator[str]:
    """Data sources reach Grafana (the sidecar's label and namespace), and what they name from
    Grafana's pod, its environment and its files, is there."""
    sidecar = _env(containers.get("grafana-sc-datasources") or {})
    main = containers["grafana"]
    variables = set(_env(main))
    label, value = sidecar.get("LABEL"), sidecar.get("LABEL_VALUE")
    watched = str(sidecar.get("NAMESPACE") or grafana.namespace)
    for config_map in graph.of_kind("ConfigMap"):
        datasources = _datasources(config_map)
        if not datasources or not sidecar:
            continue
        if label not in config_map.labels or (value and config_map.labels[label] != value):
            yield f"{config_map}: data sources without the sidecar's label {label}={value}"
            continue
        if watched != "ALL" and config_map.namespace not in watched.split(","):
            yield f"{config_map}: data sources outside the namespaces Grafana watches ({watched})"
            continue
        for source in datasources:
            where = f"{config_map}: data source {source.get('uid') or source.get('name')}"
            if (source.get("jsonData") or {}).get("sslmode") == "verify-full":
                host = str(source.get("url", "")).rpartition(":")[0] or str(source.get("url"))
                for line in _certificate_name_findings(graph, host):
                    yield f"{where}: {line}"
            for variable in sorted(set(GRAFANA_ENV.findall(json.dumps(source))) - variables):
                yield f"{where}: Grafana has no environment variable {variable}"
            for field in ("sslRootCertFile", "sslCertFile", "sslKeyFile"):
                path = (source.get("jsonData") or {}).get(field)
                problem = _mounted_file(graph, grafana, main, str(path)) if path else None
                if problem:
                    yield f"{where}: {field} {path}: {problem}"


def _holds_dashboard(config_map: K8sObject) -> bool:
    for text in (config_map.manifest.get("data") or {}).values():
        try:
            document = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(document, dict) and "panels" in document:
            return True
    return False


def _secret_key_finding(
    graph: ObjectGraph,
    owner: K8sObject,
    container: Mapping[str, Any],
    env: str,
    ref: Mapping[str, Any],
) -> Iterator[str]:
    secret = graph.find("Secret", str(ref.get("name")), owner.namespace)
    where = f"{owner}: container {container.get('name')} env {env}"
    if secret is None:
        yield f"{where}: no Secret {owner.namespace}/{ref.get('name')}"
        return
    keys = {*(secret.manifest.get("data") or {}), *(secret.manifest.get("stringData") or {})}
    if ref.get("key") not in keys:
        yield f"{where}: Secret {secret.name} has no key {ref.get('key')} (it has {sorted(keys)})"


# -- scheduling ---------------------------------------------------------------------------------


def scheduling_findings(graph: ObjectGraph) -> list[str]:
    pools = graph.platform.pools
    if not pools:
        return [
            f"the stack declares no node pools on {graph.platform.name}: nothing to schedule on"
        ]
    findings = []
    gpu_pools = [p for p in pools if p.is_gpu]
    for workload in workloads(graph):
        placement = PodPlacement.of(workload.spec)
        fitting = fitting_pools(placement, pools)
        if not workload.every_node:
            fitting = [p for p in fitting if p.has_nodes]
        opt_in = workload.every_node and any(
            key.startswith(DISCOVERED_LABEL_PREFIXES) for key in placement.node_selector
        )
        if not fitting and not opt_in:
            reasons = "; ".join(
                f"{p.name}: {misfit(placement, p) or 'no nodes (desired size 0)'}" for p in pools
            )
            findings.append(f"{workload.owner}: fits no node pool with nodes ({reasons})")
        elif not opt_in and workload.every_node and placement.node_selector.get(GPU_NODE_LABEL_KEY):
            for pool in gpu_pools:
                reason = misfit(placement, pool)
                if reason:
                    findings.append(f"{workload.owner}: misses GPU pool {pool.name}: {reason}")
    findings.extend(_device_plugin_findings(graph, gpu_pools))
    findings.extend(_claim_findings(graph))
    return findings


def volume_claims(graph: ObjectGraph) -> Iterator[tuple[K8sObject, str, str | None]]:
    """``(owner, what, storage class or None)`` of every volume claim the stack's objects make:
    PersistentVolumeClaims, StatefulSets' claim templates, Prometheus' and Alertmanager's storage,
    the database's instances."""
    for obj in graph.objects:
        spec = obj.manifest.get("spec") or {}
        if obj.kind == "PersistentVolumeClaim":
            yield obj, "claim", spec.get("storageClassName")
        elif obj.kind == "StatefulSet":
            for template in spec.get("volumeClaimTemplates") or ():
                name = (template.get("metadata") or {}).get("name")
                yield obj, f"claim {name}", (template.get("spec") or {}).get("storageClassName")
        elif obj.api_version == MONITORING_GROUP and obj.kind in ("Prometheus", "Alertmanager"):
            template = (spec.get("storage") or {}).get("volumeClaimTemplate")
            if template is not None:
                claim = template.get("spec") or {}
                yield obj, "storage", claim.get("storageClassName")
    yield from cnpg_claims(graph)


def _claim_findings(graph: ObjectGraph) -> Iterator[str]:
    """A claim's StorageClass exists: one the stack creates or the cluster has; a claim that names
    none needs a default class."""
    classes = {c.name: c for c in graph.of_kind("StorageClass")}
    existing = set(classes) | set(graph.platform.storage_classes)
    default = [
        name
        for name, c in classes.items()
        if str(c.metadata.get("annotations", {}).get(DEFAULT_CLASS_ANNOTATION)) == "true"
    ]
    for owner, what, storage_class in volume_claims(graph):
        if storage_class and storage_class not in existing:
            yield (
                f"{owner}: {what}: StorageClass {storage_class} is neither created by the stack "
                f"nor said to exist (render --assume-storage-class); its volume would stay Pending"
            )
        elif not storage_class and not default:
            yield (
                f"{owner}: {what}: names no StorageClass and the cluster has no default one; "
                f"its volume would stay Pending"
            )


def _device_plugin_findings(graph: ObjectGraph, gpu_pools: list[NodePool]) -> Iterator[str]:
    """Every GPU pool runs NVIDIA's device plugin: without it no node there registers
    nvidia.com/gpu, no GPU pod fits, and Karpenter never counts its nodes initialised."""
    plugins = [
        PodPlacement.of(_pod_spec(obj))
        for obj in graph.of_kind("DaemonSet")
        if any(DEVICE_PLUGIN_IMAGE in str(c.get("image")) for c in _containers(_pod_spec(obj)))
    ]
    for pool in gpu_pools:
        if not any(misfit(plugin, pool) is None for plugin in plugins):
            yield (
                f"GPU pool {pool.name}: no NVIDIA device plugin runs there, so its nodes never "
                f"register {GPU_RESOURCE} (Karpenter never counts them initialised)"
            )


def conflict_findings(graph: ObjectGraph) -> list[str]:
    """Two objects of one kind, namespace and name: the second install fails, or takes the first
    over (two metrics servers for one APIService)."""
    seen: dict[tuple[str, str, str | None, str], K8sObject] = {}
    findings = []
    for obj in graph.objects:
        key = (obj.api_version.rpartition("/")[0], obj.kind, obj.namespace, obj.name)
        first = seen.setdefault(key, obj)
        if first is not obj:
            findings.append(f"{obj}: {first.source} creates it too")
    return findings


def scaler_findings(graph: ObjectGraph) -> list[str]:
    """KEDA ScaledObjects and HPAs scale a workload the stack creates, on a query KEDA can run."""
    findings = []
    for scaler in graph.of_kind("ScaledObject", "HorizontalPodAutoscaler"):
        spec = scaler.manifest.get("spec") or {}
        target = spec.get("scaleTargetRef") or {}
        kind = target.get("kind") or "Deployment"
        if graph.find(kind, str(target.get("name")), scaler.namespace) is None:
            findings.append(
                f"{scaler}: scales {kind} {scaler.namespace}/{target.get('name')}, which the "
                f"stack does not create"
            )
        for index, trigger in enumerate(spec.get("triggers") or ()):
            metadata = trigger.get("metadata") or {}
            if trigger.get("type") == "prometheus" and not (
                metadata.get("serverAddress") and metadata.get("query")
            ):
                findings.append(f"{scaler}: trigger {index} needs serverAddress and query")
    return findings


def values_findings(graph: ObjectGraph) -> list[str]:
    return [
        f"release {release.name}: value {key} is not one the chart {release.chart.name} has; "
        f"Helm ignores it"
        for release in graph.releases
        for key in ignored_values(release.chart, release.values)
    ]


Check = Callable[[ObjectGraph, frozenset[str]], list[str]]
CHECKS: dict[str, Check] = {
    "values": lambda graph, _assumed: values_findings(graph),
    "schema": lambda graph, _assumed: invalid_objects(graph),
    "namespaces": missing_namespaces,
    "monitoring": lambda graph, _assumed: monitoring_findings(graph),
    "references": reference_findings,
    "grafana": lambda graph, _assumed: grafana_findings(graph),
    "scheduling": lambda graph, _assumed: scheduling_findings(graph),
    "conflicts": lambda graph, _assumed: conflict_findings(graph),
    "scalers": lambda graph, _assumed: scaler_findings(graph),
    "admission": lambda graph, _assumed: admission_findings(graph),
}


def run_checks(
    graph: ObjectGraph, assumed_namespaces: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Every check's findings, by check name."""
    return {name: check(graph, assumed_namespaces) for name, check in CHECKS.items()}
