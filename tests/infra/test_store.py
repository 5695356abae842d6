"""The profiler's store in both stacks under Pulumi mocks (a test double, see
tests/infra/store_objects.py), whichever ``profilerStore`` holds it: Grafana reading it and its
dashboards shipped, the ``sqlite`` store on the node, and the config mistakes refused in one line.

Test double: Pulumi's mock engine instead of the Pulumi CLI, AWS and a Kubernetes API server
(infra/render/program.py); generated passwords, keys and certificates are placeholders. What the
objects become in a cluster (schemas against the CloudNativePG chart's CRDs, Services, scheduling,
volume claims, Secret wiring) is checked on the rendered graph in test_render_store.py; the
connection the daemon makes from this wiring runs against a real PostgreSQL and PgBouncer in
tests/integration/test_store_wiring.py.

Each database has its own module: test_store_cloudnative_pg.py (the default), test_store_rds.py
and test_store_external.py.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from infra.render.program import FAKE_PASSWORD, ProgramRun, run_stack
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK
from tests.infra.store_objects import (
    CLUSTER,
    CONFIG_MAP,
    DAEMON_SET,
    NAMESPACE,
    SECRET,
    daemon_env,
    datasource,
    named,
)

# -- Grafana ---------------------------------------------------------------------------------------


def test_grafana_reads_the_store_as_the_read_only_user_over_verified_tls(
    eks_run: ProgramRun,
) -> None:
    source = datasource(eks_run)
    assert source["uid"] == "gpu-profiler-store"
    assert source["type"] == "postgres"
    assert source["user"] == "gpu_profiler_reader"
    assert source["jsonData"]["database"] == "gpu_profiler"
    assert source["jsonData"]["sslmode"] == "verify-full"
    assert source["jsonData"]["tlsConfigurationMethod"] == "file-path"
    assert source["jsonData"]["sslRootCertFile"] == "/etc/grafana/gpu-profiler-store-ca/ca.crt"
    # The password is read from Grafana's environment, which takes it from a Secret.
    assert source["secureJsonData"] == {"password": "$__env{GPU_PROFILER_STORE_PASSWORD}"}
    grafana = eks_run.release("kube-prometheus-stack").inputs["values"]["grafana"]
    assert grafana["envValueFrom"] == {
        "GPU_PROFILER_STORE_PASSWORD": {
            "secretKeyRef": {"name": "gpu-profiler-store-reader", "key": "password"}
        }
    }
    assert grafana["extraConfigmapMounts"] == [
        {
            "name": "gpu-profiler-store-ca",
            "mountPath": "/etc/grafana/gpu-profiler-store-ca",
            "configMap": "gpu-profiler-store-ca",
            "readOnly": True,
        }
    ]
    secret = named(eks_run, SECRET, "gpu-profiler-store-reader", "monitoring")
    assert secret.inputs["stringData"]["password"] == FAKE_PASSWORD
    assert "stringData" in secret.secret_paths
    # Grafana's pod refers to both: they exist before the release installs it.
    release = eks_run.release("kube-prometheus-stack")
    ca = named(eks_run, CONFIG_MAP, "gpu-profiler-store-ca", "monitoring")
    assert {secret.urn, ca.urn} <= set(release.dependencies)


def test_every_dashboard_file_is_provisioned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dashboard added to infra/monitoring/dashboards (the store's history) is shipped, and the
    PromQL checks skip its SQL panels."""
    from infra import monitoring  # noqa: PLC0415

    shipped = monitoring.dashboards()
    history = {
        "title": "GPU history",
        "panels": [
            {
                "title": "GPU-hours by job type",
                "datasource": {"type": "postgres", "uid": "gpu-profiler-store"},
                "targets": [{"rawSql": "SELECT 1", "format": "time_series"}],
            }
        ],
    }
    monkeypatch.setattr(
        monitoring, "dashboards", lambda: {**shipped, "gpu-history.json": json.dumps(history)}
    )
    assert all(name != "gpu-history.json" for name, _, _ in monitoring.dashboard_targets())
    run = run_stack(EKS_STACK)
    config_map = named(run, CONFIG_MAP, "dashboard-gpu-history", "monitoring")
    assert config_map.inputs["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(config_map.inputs["data"]["gpu-history.json"]) == history
    assert len(run.of_type(CONFIG_MAP)) > len(shipped)


# -- sqlite ---------------------------------------------------------------------------------------


def test_sqlite_store_keeps_a_file_on_the_node_owned_by_the_daemon() -> None:
    run = run_stack(EKS_STACK, overrides={"profilerStore": "sqlite"})
    pod = run.one(DAEMON_SET).get("spec.template.spec")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["store"]["hostPath"] == {
        "path": "/var/lib/gpu-profiler",
        "type": "DirectoryOrCreate",
    }
    assert (
        daemon_env(run)["GPU_PROFILER_STORE_URL"] == "sqlite:////var/lib/gpu-profiler/profiler.db"
    )
    (owner,) = pod["initContainers"]
    assert owner["command"][-1] == (
        "chown 65532:65532 /var/lib/gpu-profiler && chmod 0750 /var/lib/gpu-profiler"
    )
    security = owner["securityContext"]
    assert security["runAsUser"] == 0
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert security["allowPrivilegeEscalation"] is False
    (daemon,) = pod["containers"]
    assert daemon["securityContext"]["runAsUser"] == 65532  # the daemon itself stays unprivileged
    labels = named(run, NAMESPACE, "gpu-profiler").inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # hostPath needs it
    assert not run.of_type(CLUSTER)


# -- config errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stack", "overrides", "secrets", "message"),
    [
        (
            EKS_STACK,
            {"profilerStore": "postgres"},
            {},
            "must be one of cloudnative-pg, rds, external, sqlite",
        ),
        (KUBEADM_STACK, {"profilerStore": "rds"}, {}, "only the EKS stack creates"),
        (EKS_STACK, {"profilerStore": "external"}, {}, "needs the database's URL"),
        (
            EKS_STACK,
            {"profilerStoreAllowUnverifiedTls": True},
            {},
            "profilerStoreAllowUnverifiedTls is for profilerStore: external",
        ),
        (EKS_STACK, {}, {"profilerStoreUrl": "postgresql://x@y/z"}, "set profilerStore: external"),
        (
            EKS_STACK,
            {"profilerStore": "rds", "profilerDatabase": {"instances": 3}},
            {},
            "profilerDatabase is for profilerStore: cloudnative-pg",
        ),
        (
            EKS_STACK,
            {"profilerDatabase": {"replicas": 3}},
            {},
            "profilerDatabase has unknown keys replicas",
        ),
        (EKS_STACK, {"profilerDatabase": {"instances": 0}}, {}, "instances must be at least 1"),
        (
            EKS_STACK,
            {"profilerStore": "rds", "profilerRds": {"backupRetentionDays": 0}},
            {},
            "automated backups stay on",
        ),
    ],
)
def test_store_config_mistakes_stop_with_one_message(
    stack: Any, overrides: dict[str, Any], secrets: dict[str, str], message: str
) -> None:
    with pytest.raises(pulumi.RunError, match=message) as raised:
        run_stack(stack, overrides=overrides, secrets=secrets)
    assert "\n" not in str(raised.value)
