"""The ``grafana`` check: dashboards and data sources carry the labels Grafana's sidecars watch,
in a namespace they watch; the Secret Grafana's credentials come from exists with its keys; every
environment variable a data source names and every certificate file it reads is Grafana's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from infra.render.checks.objects import data_keys, pod_containers, pod_spec
from infra.render.checks.references import certificate_name_findings
from infra.render.graph import K8sObject, ObjectGraph

GRAFANA_ENV = re.compile(r"\$__env\{(\w+)\}")


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or ()}


def grafana_findings(graph: ObjectGraph) -> list[str]:
    findings = []
    for grafana in graph.of_kind("Deployment"):
        containers = {c.get("name"): c for c in pod_containers(pod_spec(grafana))}
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
    volumes = {v.get("name"): v for v in pod_spec(pod).get("volumes") or ()}
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
            return None if key in data_keys(found) else f"{kind} {found.name} has no key {key}"
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
                for line in certificate_name_findings(graph, host):
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
