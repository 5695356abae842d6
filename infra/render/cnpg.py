"""What the CloudNativePG operator makes from the stack's ``Cluster`` and ``Pooler`` objects.

The checks see them as the operator (1.30) creates them: the instance pods (placed by the Cluster's
``affinity``, with its labels and ports) and the pooler pods (the Pooler's ``template``); the
Services ``<cluster>-rw``, ``-ro``, ``-r`` and ``<pooler>``; a volume claim per instance (the
Cluster's ``storage`` and ``walStorage``); and the Secrets each object names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infra.render.graph import K8sObject, ObjectGraph

CNPG_GROUP = "postgresql.cnpg.io/"
POSTGRESQL_PORT = 5432
INSTANCE_PORTS = (("postgresql", POSTGRESQL_PORT), ("metrics", 9187), ("status", 8000))
POOLER_PORTS = (("pgbouncer", POSTGRESQL_PORT), ("metrics", 9127))
CLUSTER_SERVICES = ("rw", "ro", "r")
CLUSTER_DOMAIN = "cluster.local"  # the operator's default KUBERNETES_CLUSTER_DOMAIN


def _cnpg(graph: ObjectGraph, kind: str) -> list[K8sObject]:
    return [o for o in graph.of_kind(kind) if o.api_version.startswith(CNPG_GROUP)]


def _container(name: str, ports: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    return {
        "name": name,
        "ports": [{"name": port, "containerPort": number} for port, number in ports],
    }


@dataclass(frozen=True)
class OperatorPods:
    """Pods an operator creates for an object: their spec (placement, containers) and labels."""

    owner: K8sObject
    spec: Mapping[str, Any]
    labels: Mapping[str, str]


def cnpg_pods(graph: ObjectGraph) -> Iterator[OperatorPods]:
    """The instance pods of every Cluster and the PgBouncer pods of every Pooler."""
    for cluster in _cnpg(graph, "Cluster"):
        affinity = (cluster.manifest.get("spec") or {}).get("affinity") or {}
        spec = {
            "nodeSelector": affinity.get("nodeSelector") or {},
            "tolerations": affinity.get("tolerations") or [],
            "affinity": {"nodeAffinity": affinity["nodeAffinity"]}
            if affinity.get("nodeAffinity")
            else {},
            "containers": [_container("postgres", INSTANCE_PORTS)],
        }
        labels = {"cnpg.io/cluster": cluster.name, "cnpg.io/podRole": "instance"}
        yield OperatorPods(cluster, spec, labels)
    for pooler in _cnpg(graph, "Pooler"):
        pooler_spec = pooler.manifest.get("spec") or {}
        template = pooler_spec.get("template") or {}
        spec = {
            **(template.get("spec") or {}),
            "containers": [_container("pgbouncer", POOLER_PORTS)],
        }
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            "cnpg.io/cluster": str((pooler_spec.get("cluster") or {}).get("name")),
            "cnpg.io/poolerName": pooler.name,
            "cnpg.io/podRole": "pooler",
        }
        yield OperatorPods(pooler, spec, labels)


def _service(
    name: str, namespace: str | None, selector: dict[str, str], port: tuple[str, int]
) -> dict[str, Any]:
    return {
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {}},
        "spec": {"selector": selector, "ports": [{"name": port[0], "port": port[1]}]},
    }


def cnpg_services(graph: ObjectGraph) -> list[dict[str, Any]]:
    """The Services the operator keeps for every Cluster and Pooler."""
    services = [
        _service(
            f"{cluster.name}-{suffix}",
            cluster.namespace,
            {"cnpg.io/cluster": cluster.name, "cnpg.io/podRole": "instance"},
            ("postgres", POSTGRESQL_PORT),
        )
        for cluster in _cnpg(graph, "Cluster")
        for suffix in CLUSTER_SERVICES
    ]
    services += [
        _service(
            pooler.name,
            pooler.namespace,
            {"cnpg.io/poolerName": pooler.name},
            ("pgbouncer", POSTGRESQL_PORT),
        )
        for pooler in _cnpg(graph, "Pooler")
    ]
    return services


def cnpg_claims(graph: ObjectGraph) -> Iterator[tuple[K8sObject, str, str | None]]:
    """``(cluster, what, storage class or None)`` of each volume an instance claims."""
    for cluster in _cnpg(graph, "Cluster"):
        spec = cluster.manifest.get("spec") or {}
        for field in ("storage", "walStorage"):
            storage = spec.get(field)
            if storage is None:
                continue
            template = storage.get("pvcTemplate") or {}
            storage_class = storage.get("storageClass") or template.get("storageClassName")
            yield cluster, field, storage_class


def cnpg_secret_refs(graph: ObjectGraph) -> Iterator[tuple[K8sObject, str, str, tuple[str, ...]]]:
    """``(object, where, Secret name, keys it must hold)`` of every Secret a Cluster names that
    the operator does not make itself, and the Cluster every Pooler names (as ``Cluster``)."""
    for cluster in _cnpg(graph, "Cluster"):
        spec = cluster.manifest.get("spec") or {}
        initdb = (spec.get("bootstrap") or {}).get("initdb") or {}
        basic_auth = ("username", "password")
        if initdb.get("secret"):
            yield cluster, "bootstrap.initdb.secret", initdb["secret"]["name"], basic_auth
        for role in (spec.get("managed") or {}).get("roles") or ():
            if role.get("passwordSecret"):
                where = f"managed role {role.get('name')}"
                yield cluster, where, role["passwordSecret"]["name"], basic_auth
        certificates = spec.get("certificates") or {}
        if certificates.get("serverCASecret"):
            # Without serverTLSSecret, the operator signs the server certificates with ca.key.
            ca_keys = ("ca.crt",) if certificates.get("serverTLSSecret") else ("ca.crt", "ca.key")
            yield cluster, "certificates.serverCASecret", certificates["serverCASecret"], ca_keys


def pooler_cluster_findings(graph: ObjectGraph) -> Iterator[str]:
    """Every Pooler names a Cluster of its namespace."""
    clusters = {(c.namespace, c.name) for c in _cnpg(graph, "Cluster")}
    for pooler in _cnpg(graph, "Pooler"):
        name = ((pooler.manifest.get("spec") or {}).get("cluster") or {}).get("name")
        if (pooler.namespace, name) not in clusters:
            yield f"{pooler}: spec.cluster {pooler.namespace}/{name} is no Cluster of the stack"


def _service_names(service: str, namespace: str | None) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
    ]


def server_certificate_names(cluster: K8sObject) -> list[str]:
    """The DNS names of the server certificate the operator issues for a Cluster (unless it is
    given one): its -rw, -r and -ro Services' and ``certificates.serverAltDNSNames``, as operator
    1.30's ``GetClusterAltDNSNames`` lists them."""
    spec = cluster.manifest.get("spec") or {}
    names = [
        name
        for suffix in ("rw", "r", "ro")
        for name in _service_names(f"{cluster.name}-{suffix}", cluster.namespace)
    ]
    return names + list((spec.get("certificates") or {}).get("serverAltDNSNames") or ())


def verified_names(graph: ObjectGraph, host: str) -> list[str] | None:
    """The names a client reaching ``host`` may verify (``sslmode=verify-full``) when ``host`` is
    a Service of a Cluster or Pooler of the stack (the pooler serves its Cluster's certificate);
    None for any other host."""
    bare = host.rstrip(".").removesuffix(f".svc.{CLUSTER_DOMAIN}").removesuffix(".svc")
    service, _, namespace = bare.partition(".")
    clusters = {(c.namespace, c.name): c for c in _cnpg(graph, "Cluster")}
    for cluster in clusters.values():
        if cluster.namespace == namespace and service in {
            f"{cluster.name}-{suffix}" for suffix in CLUSTER_SERVICES
        }:
            return server_certificate_names(cluster)
    for pooler in _cnpg(graph, "Pooler"):
        if pooler.namespace == namespace and pooler.name == service:
            name = ((pooler.manifest.get("spec") or {}).get("cluster") or {}).get("name")
            named = clusters.get((namespace, str(name)))
            return server_certificate_names(named) if named else []
    return None
