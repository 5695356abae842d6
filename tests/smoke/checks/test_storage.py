"""Storage: a volume of the cluster's block storage binds and takes writes (EBS CSI on EKS), and
the profiler's database, where it keeps its rows in one, is healthy and written to."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, eventually, fail_on
from tests.smoke.checks.layout import SmokeSettings
from tests.smoke.checks.pods import run_pod
from tests.smoke.checks.prometheus import Prometheus
from tests.smoke.checks.scheduling import why_not_running
from tests.smoke.checks.services import (
    DATABASE_CLUSTERS_PATH,
    HEALTHY_DATABASE_PHASE,
    NotServedError,
    list_or_not_served,
)
from tests.smoke.checks.volumes import (
    claim_manifest,
    claim_problem,
    storage_class,
    writer_manifest,
)

pytestmark = pytest.mark.smoke
STORE_URL_ENV = "GPU_PROFILER_STORE_URL"
STORE_ERRORS = 'sum(increase(gpu_profiler_errors_total{kind="store"}[15m]))'


def test_a_volume_binds_and_takes_writes(
    cluster: Cluster, settings: SmokeSettings, smoke_namespace: str
) -> None:
    class_name, why = storage_class(cluster, settings.storage_class)
    if class_name is None and settings.storage_class is None:
        pytest.skip(f"{why}: give --storage-class to check one")
    fail_on([why] if why else [], "The storage class to check does not exist")
    assert class_name is not None
    cluster.create(
        f"/api/v1/namespaces/{smoke_namespace}/persistentvolumeclaims", claim_manifest(class_name)
    )
    run = run_pod(
        cluster,
        smoke_namespace,
        writer_manifest(settings.image),
        keep_running=False,
        timeout=settings.pod_timeout_seconds,
    )
    problems = []
    if run.problem or run.phase != "Succeeded":
        claim = claim_problem(cluster, smoke_namespace)
        problems.append(
            f"{run.describe()}: {run.problem or why_not_running(run.pod)}"
            + (f"; {claim}" if claim else "")
            + f": check the StorageClass {class_name}'s provisioner (on EKS the EBS CSI driver "
            "add-on and its IAM role: `kubectl -n kube-system logs deploy/ebs-csi-controller`)"
        )
    elif "wrote and read back" not in run.log:
        problems.append(f"{run.describe()}: the volume check printed nothing")
    fail_on(problems, f"A volume of StorageClass {class_name} does not bind or take writes")


def _store_secret(cluster: Cluster, settings: SmokeSettings) -> bool:
    """Whether the profiler keeps its rows in a database (its store URL comes from a Secret)."""
    ref = settings.daemon_sets()["profiler"]
    found = cluster.get_or_none(f"/apis/apps/v1/namespaces/{ref.namespace}/daemonsets/{ref.name}")
    containers = ((found or {}).get("spec", {}).get("template", {}).get("spec") or {}).get(
        "containers"
    ) or []
    return any(
        env.get("name") == STORE_URL_ENV and "valueFrom" in env
        for container in containers
        for env in container.get("env") or []
    )


def test_the_store_database_is_healthy_and_written_to(
    cluster: Cluster, settings: SmokeSettings, cluster_prometheus: Prometheus
) -> None:
    if not _store_secret(cluster, settings):
        pytest.skip("the profiler keeps SQLite on each node: no database store is deployed")

    def probe() -> list[str]:
        problems = []
        try:
            path = DATABASE_CLUSTERS_PATH.format(namespace=settings.profiler_namespace)
            databases = list_or_not_served(cluster, path)
        except NotServedError:
            databases = []  # an external database: only the profiler can tell
        for database in databases:
            status = database.get("status") or {}
            wanted = (database.get("spec") or {}).get("instances")
            if status.get("phase") != HEALTHY_DATABASE_PHASE:
                problems.append(
                    f"database cluster {database['metadata']['name']} is "
                    f"{status.get('phase') or 'not reporting'} ({status.get('readyInstances', 0)} "
                    f"of {wanted} instances ready)"
                )
        samples = cluster_prometheus.query(STORE_ERRORS)
        errors = float(samples[0]["value"][1]) if samples else 0.0
        if errors > 0:
            problems.append(
                f"the profiler failed {errors:.0f} times to write its store in the last 15 "
                'minutes (gpu_profiler_errors_total{kind="store"}): check the store URL and '
                "the database (the profiler pods' logs)"
            )
        return problems

    fail_on(eventually(probe, settings.timeout_seconds), "The profiler's database is unhealthy")
