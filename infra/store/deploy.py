"""The store's part of a stack, in the two steps the GPU layer takes.

1. :func:`plan_store` (before the platform): the passwords, the CloudNativePG CA, the RDS instance;
   nothing in the cluster yet. Grafana's data source is made from its endpoint, so Grafana finds
   the reader's Secret and the CA when it starts.
2. :func:`deploy_store` (after the platform, whose Prometheus CRDs the PodMonitors need): the
   storage provisioner where the cluster has none, the CloudNativePG operator and database, or the
   Job that creates RDS's users. The profiler's DaemonSet waits for what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra.storage import LOCAL_PATH_CLASS, local_path_provisioner
from infra.store.cloudnative_pg import CloudNativePgArgs, CloudNativePgStore, cnpg_endpoint
from infra.store.credentials import StoreCa, StoreCredentials
from infra.store.endpoint import (
    PostgresStore,
    ProfilerStore,
    SqliteStore,
    StoreEndpoint,
    UrlStore,
)
from infra.store.options import StoreOptions
from infra.store.rds import RdsArgs, RdsDatabase, RdsNetwork, RdsRoles


@dataclass(frozen=True)
class StorePlan:
    """What step 1 made, and what step 2 needs."""

    options: StoreOptions
    endpoint: StoreEndpoint | None = None  # None: sqlite and external
    database: CloudNativePgArgs | None = None
    ca: StoreCa | None = None
    local_path: bool = False  # install local-path-provisioner for the database's volumes
    rds: RdsDatabase | None = None
    rds_args: RdsArgs | None = None
    rds_network: RdsNetwork | None = None

    @property
    def profiler_store(self) -> ProfilerStore:
        if self.endpoint is not None:
            return PostgresStore(self.endpoint)
        if self.options.url is not None:
            return UrlStore(self.options.url, self.options.ca)
        return SqliteStore()


def cloudnative_pg_args(
    options: StoreOptions,
    default_storage_class: str | None,
    monitoring_namespace: str,
    profiler_namespace: str,
) -> CloudNativePgArgs:
    """``profilerDatabase`` over the defaults; ValueError on an impossible value."""
    spec = options.database
    defaults = CloudNativePgArgs(storage_class=LOCAL_PATH_CLASS)
    return CloudNativePgArgs(
        storage_class=spec.get("storageClass") or default_storage_class or LOCAL_PATH_CLASS,
        monitoring_namespace=monitoring_namespace,
        client_namespaces=(profiler_namespace,),
        instances=spec.get("instances", defaults.instances),
        storage_size=spec.get("storageSize", defaults.storage_size),
        cpu_request=spec.get("cpuRequest", defaults.cpu_request),
        memory_request=spec.get("memoryRequest", defaults.memory_request),
        cpu_limit=spec.get("cpuLimit", defaults.cpu_limit),
        memory_limit=spec.get("memoryLimit", defaults.memory_limit),
        shared_buffers=spec.get("sharedBuffers", defaults.shared_buffers),
        pooler_instances=spec.get("poolerInstances", defaults.pooler_instances),
        deletion_protection=spec.get("deletionProtection", defaults.deletion_protection),
    )


def rds_args(options: StoreOptions, profiler_image: str) -> RdsArgs:
    """``profilerRds`` over the defaults; ValueError on an impossible value."""
    spec = options.rds
    defaults = RdsArgs()
    return RdsArgs(
        instance_class=spec.get("instanceClass", defaults.instance_class),
        allocated_storage_gib=spec.get("allocatedStorageGib", defaults.allocated_storage_gib),
        max_allocated_storage_gib=spec.get(
            "maxAllocatedStorageGib", defaults.max_allocated_storage_gib
        ),
        engine_version=spec.get("engineVersion", defaults.engine_version),
        parameter_group_family=(
            f"postgres{spec['engineVersion'].split('.')[0]}"
            if "engineVersion" in spec
            else defaults.parameter_group_family
        ),
        backup_retention_days=spec.get("backupRetentionDays", defaults.backup_retention_days),
        multi_az=spec.get("multiAz", defaults.multi_az),
        deletion_protection=spec.get("deletionProtection", defaults.deletion_protection),
        bootstrap_image=profiler_image,
    )


def plan_store(
    options: StoreOptions,
    *,
    default_storage_class: str | None,
    rds_network: RdsNetwork | None,
    monitoring_namespace: str,
    profiler_namespace: str,
    profiler_image: str,
) -> StorePlan:
    """Step 1. ``default_storage_class``: the class the stack creates (EKS), None where the cluster
    has none (kubeadm: local-path-provisioner is installed unless profilerDatabase names one)."""
    if options.kind == "cloudnative-pg":
        database = cloudnative_pg_args(
            options, default_storage_class, monitoring_namespace, profiler_namespace
        )
        credentials = StoreCredentials("profiler-store-credentials")
        ca = StoreCa("profiler-store-ca")
        return StorePlan(
            options=options,
            endpoint=cnpg_endpoint(
                database, credentials.writer, credentials.reader, ca.certificate
            ),
            database=database,
            ca=ca,
            local_path=not options.database.get("storageClass") and not default_storage_class,
        )
    if options.kind == "rds":
        if rds_network is None:
            raise ValueError("profilerStore rds needs the EKS cluster's network")
        args = rds_args(options, profiler_image)
        credentials = StoreCredentials("profiler-store-credentials")
        rds = RdsDatabase(
            "profiler-store-rds",
            args,
            rds_network,
            writer=credentials.writer,
            reader=credentials.reader,
        )
        return StorePlan(
            options=options,
            endpoint=rds.endpoint,
            rds=rds,
            rds_args=args,
            rds_network=rds_network,
        )
    return StorePlan(options=options)


def deploy_store(plan: StorePlan, opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    """Step 2, in the cluster behind ``opts``' provider; returns what the DaemonSet waits for."""
    if plan.database is not None and plan.ca is not None and plan.endpoint is not None:
        storage = [local_path_provisioner(opts)] if plan.local_path else []
        store = CloudNativePgStore(
            "profiler-store",
            plan.database,
            plan.endpoint,
            plan.ca.private_key,
            storage=storage,
            opts=opts,
        )
        return [store]
    if plan.rds is not None and plan.rds_args is not None and plan.rds_network is not None:
        return [RdsRoles("profiler-store-roles", plan.rds_args, plan.rds, plan.rds_network, opts)]
    return []
