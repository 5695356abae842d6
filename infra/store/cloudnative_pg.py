"""CloudNativePgStore: the profiler's PostgreSQL in the cluster, run by the CloudNativePG operator.

- The operator chart (its CRDs are templates of the chart, upgraded with it) in its own namespace,
  with the PodMonitor for the operator's metrics and its Grafana dashboard.
- A ``Cluster`` of ``instances`` PostgreSQL pods (one primary, streaming replicas; quorum
  synchronous replication while a replica is up, so a failover loses no committed transaction),
  each on a volume of ``storage_class``; its PodDisruptionBudgets are the operator's
  (``enablePDB``: a drain of the primary's node waits for a switchover).
- A ``Pooler``: PgBouncer in transaction mode in front of the primary. It is what the daemons,
  ``report`` and Grafana connect to; it keeps at most ``2 x max_db_connections`` server connections
  however many nodes write, and refuses clients without TLS.
- TLS: the server certificates (PostgreSQL's and the pooler's, which serves the same one) are
  issued and renewed by the operator from the stack's CA (:class:`StoreCredentials`), with the
  pooler's Service names among their names, so clients verify them with ``sslmode=verify-full``.
- Users: the database owner (the daemons' writes) from ``bootstrap.initdb``; a read-only role in
  ``pg_read_all_data`` (report, Grafana) managed by the operator; both passwords from Secrets.
- PodMonitors for the instances and the pooler, a PodDisruptionBudget for the pooler, and
  NetworkPolicies: only the operator, the instances and the pooler reach PostgreSQL; only the
  clients' namespaces reach the pooler; only the monitoring namespace reaches the metrics ports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import versions
from infra.platform import GRAFANA_POD_LABELS, helm_release, namespace_name
from infra.store.endpoint import (
    CA_CONFIG_MAP,
    CA_KEY,
    DATABASE,
    PASSWORD_KEY,
    POSTGRESQL_PORT,
    READER_USER,
    USERNAME_KEY,
    WRITER_USER,
    DatabaseUser,
    StoreEndpoint,
)
from infra.versions import HelmChart

CNPG_API = "postgresql.cnpg.io/v1"
OPERATOR_RELEASE = "cloudnative-pg"
CLUSTER_NAME = "gpu-profiler-store"
POOLER_NAME = f"{CLUSTER_NAME}-pooler"
SERVER_CA_SECRET = f"{CLUSTER_NAME}-server-ca"
WRITER_SECRET = f"{CLUSTER_NAME}-writer"
READER_SECRET = f"{CLUSTER_NAME}-reader"
CLUSTER_DOMAIN = "cluster.local"  # the operator's default (KUBERNETES_CLUSTER_DOMAIN)
# The operator's labels on the pods it makes, and their ports.
CLUSTER_LABEL = "cnpg.io/cluster"
POD_ROLE_LABEL = "cnpg.io/podRole"
POOLER_LABEL = "cnpg.io/poolerName"
INSTANCE_METRICS_PORT = 9187
INSTANCE_STATUS_PORT = 8000
POOLER_METRICS_PORT = 9127
# Server connections per PgBouncer pod to the one database, both users together: with the default
# two pooler pods, at most 40 of PostgreSQL's 100.
POOLER_SERVER_CONNECTIONS = 20
POOLER_PARAMETERS = {
    "max_client_conn": "4000",  # a connection per node's daemon, with room
    "default_pool_size": "10",
    "max_db_connections": str(POOLER_SERVER_CONNECTIONS),
    # psycopg prepares statements it runs often; PgBouncer tracks them across server connections.
    "max_prepared_statements": "200",
    "client_tls_sslmode": "require",  # no plaintext client
    "server_tls_sslmode": "verify-ca",
}


@dataclass(frozen=True)
class CloudNativePgArgs:
    """The database's shape; the defaults suit a few thousand GPUs (docs/store.md: sizing)."""

    storage_class: str
    namespace: str = CLUSTER_NAME
    operator_namespace: str = "cnpg-system"
    monitoring_namespace: str = "monitoring"
    # Namespaces whose pods may connect to the pooler (the profiler's; Grafana's pods are added).
    client_namespaces: tuple[str, ...] = ("gpu-profiler",)
    instances: int = 2
    storage_size: str = "50Gi"
    cpu_request: str = "500m"
    memory_request: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "1Gi"
    shared_buffers: str = "256MB"
    pooler_instances: int = 2
    # Pulumi refuses to delete or replace the Cluster (and with it its volumes) until unprotected.
    deletion_protection: bool = True
    chart: HelmChart = versions.CLOUDNATIVE_PG
    postgresql_image: str = versions.POSTGRESQL_IMAGE
    pgbouncer_image: str = versions.PGBOUNCER_IMAGE

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be at least 1, got {self.instances}")
        if self.pooler_instances < 1:
            raise ValueError(f"poolerInstances must be at least 1, got {self.pooler_instances}")


def service_names(service: str, namespace: str) -> list[str]:
    """The names a client may use for a Service, as the operator lists its own Services'."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
    ]


def pooler_host(namespace: str) -> str:
    """The pooler's Service as the clients name it (one of the server certificate's names)."""
    return f"{POOLER_NAME}.{namespace}.svc"


def cnpg_endpoint(
    args: CloudNativePgArgs,
    writer: DatabaseUser,
    reader: DatabaseUser,
    ca_certificate: pulumi.Input[str],
) -> StoreEndpoint:
    """How the clients reach the database: through the pooler, verifying the stack's CA."""
    return StoreEndpoint(
        host=pooler_host(args.namespace),
        port=POSTGRESQL_PORT,
        database=DATABASE,
        writer=writer,
        reader=reader,
        ca_certificate=ca_certificate,
    )


def operator_values(args: CloudNativePgArgs) -> dict[str, Any]:
    """Values of the cloudnative-pg chart."""
    return {
        "crds": {"create": True},
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "500m", "memory": "512Mi"},
        },
        "monitoring": {
            "podMonitorEnabled": True,
            # The operator's "CloudNativePG" dashboard, where Grafana's sidecar looks for them.
            "grafanaDashboard": {"create": True, "namespace": args.monitoring_namespace},
        },
    }


def cluster_spec(args: CloudNativePgArgs) -> dict[str, Any]:
    """The ``Cluster``'s spec."""
    return {
        "instances": args.instances,
        "imageName": args.postgresql_image,
        "primaryUpdateStrategy": "unsupervised",
        "enableSuperuserAccess": False,
        "enablePDB": True,
        "postgresql": {
            "parameters": {"shared_buffers": args.shared_buffers},
            # Commits wait for a replica while one is up, and go on without when none is.
            **(
                {
                    "synchronous": {
                        "method": "any",
                        "number": 1,
                        "dataDurability": "preferred",
                    }
                }
                if args.instances > 1
                else {}
            ),
        },
        "bootstrap": {
            "initdb": {
                "database": DATABASE,
                "owner": WRITER_USER,
                "secret": {"name": WRITER_SECRET},
            }
        },
        "managed": {
            "roles": [
                {
                    "name": READER_USER,
                    "ensure": "present",
                    "login": True,
                    "inRoles": ["pg_read_all_data"],
                    "passwordSecret": {"name": READER_SECRET},
                    "connectionLimit": POOLER_SERVER_CONNECTIONS,
                }
            ]
        },
        "certificates": {
            "serverCASecret": SERVER_CA_SECRET,
            "serverAltDNSNames": service_names(POOLER_NAME, args.namespace),
        },
        "storage": {"storageClass": args.storage_class, "size": args.storage_size},
        "resources": {
            "requests": {"cpu": args.cpu_request, "memory": args.memory_request},
            "limits": {"cpu": args.cpu_limit, "memory": args.memory_limit},
        },
        "affinity": {
            "enablePodAntiAffinity": True,
            "topologyKey": "kubernetes.io/hostname",
            "podAntiAffinityType": "preferred",
        },
    }


def pooler_spec(args: CloudNativePgArgs) -> dict[str, Any]:
    """The ``Pooler``'s spec: PgBouncer in transaction mode in front of the primary."""
    labels = {POOLER_LABEL: POOLER_NAME}
    return {
        "cluster": {"name": CLUSTER_NAME},
        "instances": args.pooler_instances,
        "type": "rw",
        "pgbouncer": {
            "image": args.pgbouncer_image,
            "poolMode": "transaction",
            "parameters": POOLER_PARAMETERS,
        },
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "containers": [
                    {
                        "name": "pgbouncer",
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "limits": {"cpu": "1", "memory": "256Mi"},
                        },
                    }
                ],
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "podAffinityTerm": {
                                    "labelSelector": {"matchLabels": labels},
                                    "topologyKey": "kubernetes.io/hostname",
                                },
                            }
                        ]
                    }
                },
            },
        },
    }


def _ingress(
    peers: list[dict[str, Any]], ports: list[int]
) -> k8s.networking.v1.NetworkPolicyIngressRuleArgs:
    return k8s.networking.v1.NetworkPolicyIngressRuleArgs(
        from_=[k8s.networking.v1.NetworkPolicyPeerArgs(**peer) for peer in peers],
        ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=p, protocol="TCP") for p in ports],
    )


def _namespace_peer(name: str) -> dict[str, Any]:
    return {
        "namespace_selector": k8s.meta.v1.LabelSelectorArgs(
            match_labels={"kubernetes.io/metadata.name": name}
        )
    }


class CloudNativePgStore(pulumi.ComponentResource):
    """The operator, the database cluster, its pooler, Secrets, monitors and network policies.

    Pass the Kubernetes provider in ``opts``; the PodMonitors need the Prometheus operator's CRDs
    (create this after ``GpuPlatform``). ``storage``: what provides the volumes' StorageClass.
    """

    def __init__(
        self,
        name: str,
        args: CloudNativePgArgs,
        endpoint: StoreEndpoint,
        ca_private_key: pulumi.Input[str],
        *,
        storage: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:CloudNativePgStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        restricted = {"pod-security.kubernetes.io/enforce": "restricted"}

        operator_ns = k8s.core.v1.Namespace(
            "cnpg-operator-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.operator_namespace, labels=restricted),
            opts=child,
        )
        self.operator = helm_release(
            OPERATOR_RELEASE,
            args.chart,
            namespace_name(operator_ns),
            operator_values(args),
            pulumi.ResourceOptions(parent=self, depends_on=[operator_ns]),
        )

        store_ns = k8s.core.v1.Namespace(
            "store-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.namespace, labels=restricted),
            opts=child,
        )
        namespace = namespace_name(store_ns)
        in_store = pulumi.ResourceOptions(parent=self, depends_on=[store_ns])

        def meta(
            object_name: str, labels: dict[str, str] | None = None
        ) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace, labels=labels)

        # The operator watches Secrets labelled cnpg.io/reload: a new CA or password is applied
        # without a restart.
        reload = {"cnpg.io/reload": "true"}
        server_ca = k8s.core.v1.Secret(
            "store-server-ca",
            metadata=meta(SERVER_CA_SECRET, reload),
            type="Opaque",
            string_data={
                CA_KEY: endpoint.ca_certificate,
                "ca.key": pulumi.Output.secret(ca_private_key),
            },
            opts=in_store,
        )
        # The CA's certificate alone, for clients that connect from outside (report, psql).
        k8s.core.v1.ConfigMap(
            "store-ca",
            metadata=meta(CA_CONFIG_MAP),
            data={CA_KEY: endpoint.ca_certificate},
            opts=in_store,
        )
        user_secrets = [
            k8s.core.v1.Secret(
                f"store-{role}-secret",
                metadata=meta(secret_name, reload),
                type="kubernetes.io/basic-auth",
                string_data={
                    USERNAME_KEY: user.name,
                    PASSWORD_KEY: user.password,
                },
                opts=in_store,
            )
            for role, secret_name, user in (
                ("writer", WRITER_SECRET, endpoint.writer),
                ("reader", READER_SECRET, endpoint.reader),
            )
        ]

        self.cluster = k8s.apiextensions.CustomResource(
            "store-cluster",
            api_version=CNPG_API,
            kind="Cluster",
            metadata=meta(CLUSTER_NAME),
            spec=cluster_spec(args),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.operator, server_ca, *user_secrets, *storage],
                protect=args.deletion_protection,
            ),
        )
        self.pooler = k8s.apiextensions.CustomResource(
            "store-pooler",
            api_version=CNPG_API,
            kind="Pooler",
            metadata=meta(POOLER_NAME),
            spec=pooler_spec(args),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cluster]),
        )
        pooler_labels = {POOLER_LABEL: POOLER_NAME}
        instance_labels = {CLUSTER_LABEL: CLUSTER_NAME, POD_ROLE_LABEL: "instance"}
        k8s.policy.v1.PodDisruptionBudget(
            "store-pooler-pdb",
            metadata=meta(POOLER_NAME),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pooler_labels),
            ),
            opts=in_store,
        )
        for monitor, selector in ((CLUSTER_NAME, instance_labels), (POOLER_NAME, pooler_labels)):
            k8s.apiextensions.CustomResource(
                f"store-pod-monitor-{monitor}",
                api_version="monitoring.coreos.com/v1",
                kind="PodMonitor",
                metadata=meta(monitor),
                spec={
                    "selector": {"matchLabels": selector},
                    "podMetricsEndpoints": [{"port": "metrics"}],
                },
                opts=in_store,
            )
        self._network_policies(args, meta, instance_labels, pooler_labels, in_store)

        self.namespace = namespace
        self.endpoint = endpoint
        self.register_outputs({"namespace": namespace, "host": endpoint.host})

    @staticmethod
    def _network_policies(
        args: CloudNativePgArgs,
        meta: Any,
        instance_labels: dict[str, str],
        pooler_labels: dict[str, str],
        opts: pulumi.ResourceOptions,
    ) -> None:
        """Ingress to the instances and the pooler; everything else in the namespace is theirs."""
        same_namespace = {"pod_selector": k8s.meta.v1.LabelSelectorArgs()}
        operator = _namespace_peer(args.operator_namespace)
        monitoring = _namespace_peer(args.monitoring_namespace)
        # Of the monitoring namespace, only Grafana (the data source) connects to the database.
        grafana = {
            **monitoring,
            "pod_selector": k8s.meta.v1.LabelSelectorArgs(match_labels=GRAFANA_POD_LABELS),
        }
        clients = [*(_namespace_peer(ns) for ns in args.client_namespaces), grafana]
        rules = {
            CLUSTER_NAME: (
                instance_labels,
                [
                    # Replicas stream from the primary; the pooler and the operator's jobs connect.
                    _ingress([same_namespace], [POSTGRESQL_PORT, INSTANCE_STATUS_PORT]),
                    _ingress([operator], [POSTGRESQL_PORT, INSTANCE_STATUS_PORT]),
                    _ingress([monitoring], [INSTANCE_METRICS_PORT]),
                ],
            ),
            POOLER_NAME: (
                pooler_labels,
                [
                    _ingress(clients, [POSTGRESQL_PORT]),
                    _ingress([monitoring], [POOLER_METRICS_PORT]),
                ],
            ),
        }
        for policy, (selector, ingress) in rules.items():
            k8s.networking.v1.NetworkPolicy(
                f"store-network-policy-{policy}",
                metadata=meta(policy),
                spec=k8s.networking.v1.NetworkPolicySpecArgs(
                    pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                    policy_types=["Ingress"],
                    ingress=ingress,
                ),
                opts=opts,
            )
