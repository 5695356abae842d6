"""GpuProfiler under Pulumi mocks: RBAC, pod security, probes, the daemon's environment.

Test double: Pulumi's mock engine instead of a Kubernetes API server.
"""

from __future__ import annotations

import tomllib
from typing import Any

import pulumi
import pytest
from psycopg import pq

from infra import versions
from infra.render.program import ProgramRun, StackFileError, run_stack
from profiler_app.daemon import STOP_GRACE_SECONDS
from tests.infra.conftest import EKS_STACK, REPO_ROOT

DAEMON_SET = "kubernetes:apps/v1:DaemonSet"


def pod_spec(run: ProgramRun) -> dict[str, Any]:
    spec: dict[str, Any] = run.one(DAEMON_SET).get("spec.template.spec")
    return spec


def env_of(run: ProgramRun) -> dict[str, Any]:
    (container,) = pod_spec(run)["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_cluster_role_is_exactly_nodes_get_patch_and_pods_read_patch(eks_run: ProgramRun) -> None:
    role = eks_run.one(
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "profiler-cluster-role"
    ).inputs
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in role["rules"]
    }
    assert rules == {
        (("",), ("nodes",)): ["get", "patch"],
        (("",), ("pods",)): ["get", "list", "patch", "watch"],
    }
    assert "*" not in str(role["rules"])


def test_binding_gives_the_role_to_the_profiler_account_only(eks_run: ProgramRun) -> None:
    binding = eks_run.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding").inputs
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "gpu-profiler",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-profiler", "namespace": "gpu-profiler"}
    ]
    assert pod_spec(eks_run)["serviceAccountName"] == "gpu-profiler"
    bindings = eks_run.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    assert all(b.inputs["roleRef"]["name"] != "cluster-admin" for b in bindings)


def test_runs_on_gpu_nodes_only(eks_run: ProgramRun) -> None:
    spec = pod_spec(eks_run)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_pod_is_non_root_read_only_without_capabilities(eks_run: ProgramRun) -> None:
    spec = pod_spec(eks_run)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 65532
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    assert "hostNetwork" not in spec
    assert "hostPID" not in spec
    assert all("hostPath" not in volume for volume in spec["volumes"])
    namespace = eks_run.one("kubernetes:core/v1:Namespace", "profiler-namespace").inputs
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_resources_and_probes(eks_run: ProgramRun) -> None:
    (container,) = pod_spec(eks_run)["containers"]
    assert set(container["resources"]) == {"requests", "limits"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9401, "protocol": "TCP"}]
    assert container["command"] == ["gpu-profiler", "run"]


def test_termination_grace_leaves_the_daemon_its_stop_grace(eks_run: ProgramRun) -> None:
    """SIGTERM to SIGKILL is set, not Kubernetes' unstated default, and leaves room for the
    daemon's wait for a running cycle plus closing its sinks."""
    grace = pod_spec(eks_run)["terminationGracePeriodSeconds"]
    assert grace == 30
    assert grace >= 3 * STOP_GRACE_SECONDS


def test_environment_follows_the_daemon_contract(eks_run: ProgramRun) -> None:
    env = env_of(eks_run)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPU_PROFILER_PROMETHEUS_URL"] == (
        "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    )
    assert env["GPU_PROFILER_METRICS_ADDRESS"] == "0.0.0.0"
    assert env["GPU_PROFILER_METRICS_PORT"] == "9401"
    assert env["GPU_PROFILER_NODE_LABEL"] == "Hostname"
    assert env["GPU_PROFILER_ANNOTATION_DOMAIN"] == "ai.centaurus.io"
    assert env["GPU_PROFILER_PROTECT_TRAINING"] == "true"  # Karpenter spares training pods
    # The stack's database (CloudNativePG, by default): through the pooler, TLS verified against
    # the mounted CA, the password in libpq's password file (from a Secret), never in the URL.
    assert env["GPU_PROFILER_STORE_URL"] == (
        "postgresql://gpu_profiler@gpu-profiler-store-pooler.gpu-profiler-store.svc:5432/"
        "gpu_profiler?sslmode=verify-full&sslrootcert=/etc/gpu-profiler/store-ca/ca.crt"
    )
    assert env["PGPASSFILE"] == "/run/gpu-profiler/pgpass"
    (container,) = pod_spec(eks_run)["containers"]
    mounts = {m["mountPath"]: (m["name"], m.get("readOnly")) for m in container["volumeMounts"]}
    assert mounts["/etc/gpu-profiler/store-ca"] == ("store-ca", True)
    assert mounts["/run/gpu-profiler"] == ("store-passfile", True)
    volumes = {v["name"]: v for v in pod_spec(eks_run)["volumes"]}
    assert volumes["store-ca"]["configMap"] == {"name": "gpu-profiler-store-ca"}
    assert volumes["store-credentials"]["secret"] == {
        "secretName": "gpu-profiler-store",
        "items": [{"key": "pgpass", "path": "pgpass"}],
        "defaultMode": 0o400,
    }
    # libpq ignores a password file its group may read: a copy with mode 0600, in memory.
    assert volumes["store-passfile"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    (copy,) = pod_spec(eks_run)["initContainers"]
    assert copy["command"] == [
        "install",
        "-m",
        "0600",
        "/etc/gpu-profiler/store-credentials/pgpass",
        "/run/gpu-profiler/pgpass",
    ]
    assert "runAsUser" not in copy["securityContext"]  # the pod's: the daemon's user owns it
    assert set(volumes) == {"store-ca", "store-credentials", "store-passfile", "tmp"}
    assert not [v for v in volumes.values() if "hostPath" in v]


def test_postgres_store_url_comes_from_a_secret() -> None:
    url = "postgresql+psycopg://profiler:s3cret@db.internal/profiler?sslmode=require"
    run = run_stack(
        EKS_STACK,
        overrides={"profilerStore": "external", "profilerStoreAllowUnverifiedTls": True},
        secrets={"profilerStoreUrl": url},
    )
    secret = run.one("kubernetes:core/v1:Secret", "profiler-store-secret")
    assert secret.inputs["stringData"] == {"store-url": url}
    assert "stringData" in secret.secret_paths
    assert env_of(run)["GPU_PROFILER_STORE_URL"] == {
        "secretKeyRef": {"name": "gpu-profiler-store", "key": "store-url"}
    }
    assert "s3cret" not in str(run.one(DAEMON_SET).inputs)


def test_a_private_image_is_pulled_with_the_given_secrets(eks_run: ProgramRun) -> None:
    """GHCR makes a new package private; nodes then need credentials."""
    assert "imagePullSecrets" not in pod_spec(eks_run)
    config = '{"auths": {"ghcr.io": {"auth": "dXNlcjp0b2tlbg=="}}}'
    run = run_stack(
        EKS_STACK,
        overrides={"profilerImagePullSecrets": ["ghcr-pull"]},
        secrets={"profilerRegistryCredentials": config},
    )
    assert pod_spec(run)["imagePullSecrets"] == [
        {"name": "ghcr-pull"},
        {"name": "gpu-profiler-registry"},
    ]
    secret = run.one("kubernetes:core/v1:Secret", "profiler-registry-secret")
    assert secret.inputs["type"] == "kubernetes.io/dockerconfigjson"
    assert secret.inputs["stringData"] == {".dockerconfigjson": config}
    assert "stringData" in secret.secret_paths
    assert secret.inputs["metadata"]["namespace"] == "gpu-profiler"


def test_pull_secrets_must_be_a_list_of_names() -> None:
    # Pulumi.yaml declares it an array of strings: the CLI refuses anything else, as render does.
    with pytest.raises(StackFileError, match="profilerImagePullSecrets must be of type array"):
        run_stack(EKS_STACK, overrides={"profilerImagePullSecrets": {"name": "ghcr-pull"}})
    with pytest.raises(pulumi.RunError, match="profilerImagePullSecrets must be a list"):
        run_stack(EKS_STACK, overrides={"profilerImagePullSecrets": [""]})


def test_headless_service_and_service_monitor(eks_run: ProgramRun) -> None:
    service = eks_run.one("kubernetes:core/v1:Service", "profiler-metrics-service").inputs
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9401, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "gpu-profiler"}
    monitor = eks_run.one("kubernetes:monitoring.coreos.com/v1:ServiceMonitor").inputs
    assert monitor["spec"]["selector"] == {"matchLabels": service["spec"]["selector"]}
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"  # job="gpu-profiler"
    # namespace/pod on the profiler's series name the GPU's workload, not the profiler pod;
    # tests/infra/test_profiler_scrape.py scrapes a hostile target with the rest.
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["honorLabels"] is False
    assert endpoint["relabelings"][0] == {
        "action": "labeldrop",
        "regex": "^(namespace|pod|container)$",
    }


def test_metrics_port_reachable_from_monitoring_namespace_only(eks_run: ProgramRun) -> None:
    policy = eks_run.one(
        "kubernetes:networking.k8s.io/v1:NetworkPolicy", "profiler-network-policy"
    ).inputs["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert rule["ports"] == [{"port": 9401, "protocol": "TCP"}]


ANYWHERE = {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}


def egress_of(run: ProgramRun) -> list[tuple[list[Any], list[tuple[str, int]]]]:
    policy = run.one(
        "kubernetes:networking.k8s.io/v1:NetworkPolicy", "profiler-network-policy"
    ).inputs["spec"]
    return [
        (rule["to"], [(p["protocol"], p["port"]) for p in rule["ports"]])
        for rule in policy["egress"]
    ]


def test_egress_is_dns_prometheus_the_api_server_and_the_store(eks_run: ProgramRun) -> None:
    dns, prometheus, api_server, store = egress_of(eks_run)
    assert dns == (
        [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},  # CoreDNS, EKS and kubeadm
            }
        ],
        [("UDP", 53), ("TCP", 53)],
    )
    assert prometheus == (
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        [("TCP", 9090)],
    )
    # the instance metadata service is in no rule
    assert api_server == ([ANYWHERE], [("TCP", 443), ("TCP", 6443)])
    assert store == ([{"namespaceSelector": {}}, ANYWHERE], [("TCP", 5432)])


def test_a_sqlite_store_opens_no_store_port() -> None:
    run = run_stack(EKS_STACK, overrides={"profilerStore": "sqlite"})
    assert [ports for _, ports in egress_of(run)] == [
        [("UDP", 53), ("TCP", 53)],
        [("TCP", 9090)],
        [("TCP", 443), ("TCP", 6443)],
    ]


def test_every_variable_set_is_one_the_daemon_reads(eks_run: ProgramRun) -> None:
    """Cross-check with profiler_app and libpq: a misspelt variable would silently be ignored."""
    source = "\n".join(path.read_text() for path in (REPO_ROOT / "profiler_app").rglob("*.py"))
    libpq = {option.envvar.decode() for option in pq.Conninfo.get_defaults() if option.envvar}
    assert "PGPASSWORD" in libpq
    for name in env_of(eks_run):
        assert f'"{name}"' in source or name in libpq, f"neither the daemon nor libpq reads {name}"


def test_default_image_is_the_one_the_release_workflow_publishes(eks_run: ProgramRun) -> None:
    """The stacks pointed at an image this repository never built.

    Pushing the tag v<version> publishes ghcr.io/centaurusinfra/gpu-profiler:<version>, <version>
    being pyproject's project.version: the default must be that one exactly.
    """
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == versions.PROFILER_VERSION
    assert f"ghcr.io/centaurusinfra/gpu-profiler:{version}" == versions.PROFILER_IMAGE
    (container,) = pod_spec(eks_run)["containers"]
    assert container["image"] == versions.PROFILER_IMAGE
    for stack_file in (REPO_ROOT / "stacks").glob("*/Pulumi.*.yaml"):
        assert "profilerImage" not in stack_file.read_text(), f"{stack_file} pins another image"


def test_profiler_reads_the_node_label_the_exporter_series_carry(eks_run: ProgramRun) -> None:
    assert env_of(eks_run)["GPU_PROFILER_NODE_LABEL"] == versions.DCGM_NODE_LABEL == "Hostname"


COMMAND = "command:local:Command"


def test_destroy_runs_unprotect_after_the_daemon_set_and_its_pods_are_gone(
    eks_run: ProgramRun,
) -> None:
    """The command does nothing on `pulumi up`; its delete step runs `gpu-profiler unprotect`
    with the cluster's kubeconfig (a secret). The DaemonSet depends on it, so Pulumi deletes the
    DaemonSet first, in the foreground: its deletion ends only once its pods are gone."""
    unprotect = eks_run.one(COMMAND, "profiler-unprotect")
    assert "create" not in unprotect.inputs
    assert unprotect.inputs["delete"].endswith(" -m infra.unprotect_run")
    assert unprotect.inputs["dir"] == str(REPO_ROOT)
    environment = unprotect.inputs["environment"]
    assert environment["GPU_CLUSTER_KUBECONFIG"]  # the stack's kubeconfig
    assert environment["GPU_PROFILER_ANNOTATION_DOMAIN"] == "ai.centaurus.io"
    assert any("GPU_CLUSTER_KUBECONFIG" in path for path in unprotect.secret_paths)
    daemon_set = eks_run.one(DAEMON_SET)
    assert unprotect.urn in daemon_set.dependencies
    assert daemon_set.get("metadata.annotations") == {
        "pulumi.com/deletionPropagationPolicy": "foreground"
    }


def test_protection_turned_off_makes_the_daemons_release_their_marks() -> None:
    run = run_stack(EKS_STACK, {"profilerProtectTraining": False})
    assert env_of(run)["GPU_PROFILER_PROTECT_TRAINING"] == "release"
    assert run.one(COMMAND, "profiler-unprotect")  # destroy still cleans up after it
