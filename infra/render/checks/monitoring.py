"""The ``monitoring`` check: every ServiceMonitor, PodMonitor and PrometheusRule selected by a
Prometheus; every ServiceMonitor endpoint on a Service with that port, selecting pods whose
metrics are reachable, with scrapeTimeout <= interval; every ``job="..."`` in a rule names a
scraped job."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from infra.render.checks.namespaces import namespace_labels
from infra.render.checks.objects import (
    MONITORING_GROUP,
    Workload,
    pod_containers,
    services,
    workloads,
)
from infra.render.graph import K8sObject, ObjectGraph
from infra.scheduling import label_selector_matches

# Prometheus' own defaults, which prometheus-operator keeps when the CR sets none.
DEFAULT_SCRAPE_INTERVAL = "30s"
DEFAULT_SCRAPE_TIMEOUT = "10s"
JOB_MATCHER = re.compile(r'\bjob\s*=\s*"([^"]+)"')
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    """A Prometheus duration ("1m30s") in seconds."""
    parts = DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return sum(int(number) * DURATION_SECONDS[unit] for number, unit in parts)


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
    return label_selector_matches(namespace_selector, namespace_labels(graph, obj.namespace or ""))


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
    ports = {
        p.get("name") for w in pods for c in pod_containers(w.spec) for p in c.get("ports") or ()
    }
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
