"""The ``references`` check: every in-cluster URL (HTTP or PostgreSQL) and Service reference
handed to a component resolves to a Service and port, every role binding to a role; every Secret
and ConfigMap the stack's own workloads and database objects name exists with the keys they read;
``sslmode=verify-full`` names a host the database's server certificate carries."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from infra.render.checks.namespaces import existing_namespaces
from infra.render.checks.objects import data_keys, pod_containers, pod_spec, services, workloads
from infra.render.cnpg import cnpg_secret_refs, pooler_cluster_findings, verified_names
from infra.render.graph import K8sObject, ObjectGraph

KEDA_GROUP = "keda.sh/"
URL = re.compile(r"\bhttps?://([A-Za-z0-9][A-Za-z0-9.-]*)(?::(\d+))?")
POSTGRESQL_URL = re.compile(
    r"\bpostgres(?:ql)?(?:\+\w+)?://(?:[^@/\s]*@)?([A-Za-z0-9][A-Za-z0-9.-]*)(?::(\d+))?"
)
POSTGRESQL_PORT = 5432
# The host of a PostgreSQL URL that verifies the server's name.
VERIFY_FULL_HOST = re.compile(
    r"\bpostgres(?:ql)?(?:\+\w+)?://(?:[^@/\s]*@)?([A-Za-z0-9][A-Za-z0-9.-]*)[^\s]*"
    r"[?&]sslmode=verify-full\b"
)


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
    for container in pod_containers(pod_spec(obj)):
        name = container.get("name")
        for env in container.get("env") or ():
            if "value" in env:
                yield f"container {name} env {env['name']}", str(env["value"])
        for text in [*(container.get("args") or ()), *(container.get("command") or ())]:
            yield f"container {name} args", str(text)


def certificate_name_findings(graph: ObjectGraph, host: str) -> Iterator[str]:
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


def _named_objects(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """``(where, kind, name, keys)`` of the Secrets and ConfigMaps a pod spec reads (not those
    marked optional)."""
    for container in pod_containers(spec):
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
        missing = sorted(set(keys) - data_keys(found))
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
                    f"{obj}: {where}: {line}" for line in certificate_name_findings(graph, host)
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
