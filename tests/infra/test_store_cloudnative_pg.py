"""cloudnative-pg, the default ``profilerStore`` of both stacks, under Pulumi mocks (a test
double, see tests/infra/store_objects.py): the database's instances and users, the secrets and
the password file, PgBouncer, TLS, monitoring, network policies, and the storage it lives on."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from infra import versions
from infra.render.program import (
    FAKE_CERTIFICATE,
    FAKE_PASSWORD,
    FAKE_PRIVATE_KEY,
    ProgramRun,
    run_stack,
)
from infra.store.cloudnative_pg import POOLER_PARAMETERS
from infra.store.daemon import passfile_line
from tests.infra.conftest import KUBEADM_STACK
from tests.infra.store_objects import (
    CA_FILE,
    CLUSTER,
    CONFIG_MAP,
    DAEMON_SET,
    NAMESPACE,
    SECRET,
    daemon_env,
    datasource,
    named,
)

POOLER = "kubernetes:postgresql.cnpg.io/v1:Pooler"
POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
POOLER_HOST = "gpu-profiler-store-pooler.gpu-profiler-store.svc"
GENERATORS = frozenset(
    {
        "random:index/randomPassword:RandomPassword",
        "tls:index/privateKey:PrivateKey",
        "tls:index/selfSignedCert:SelfSignedCert",
    }
)


def test_cloudnative_pg_is_the_default_store_of_both_stacks(
    eks_run: ProgramRun, kubeadm_run: ProgramRun
) -> None:
    for run in (eks_run, kubeadm_run):
        assert run.outputs["profilerStore"] == ("cloudnative-pg", False)
        assert run.outputs["profilerStoreHost"] == (POOLER_HOST, False)
        assert run.one(CLUSTER).inputs["metadata"]["namespace"] == "gpu-profiler-store"
        operator = run.release("cloudnative-pg").inputs
        assert operator["version"] == versions.CLOUDNATIVE_PG.version == "0.29.0"
        assert operator["repositoryOpts"] == {"repo": versions.CLOUDNATIVE_PG.repo}
        assert operator["namespace"] == "cnpg-system"
        assert operator["values"]["crds"] == {"create": True}  # upgraded with the operator
    port_forward = eks_run.outputs["profilerStorePortForward"][0]
    assert port_forward == (
        "kubectl -n gpu-profiler-store port-forward svc/gpu-profiler-store-pooler 15432:5432"
    )


def test_database_runs_two_instances_with_limits_and_protection(eks_run: ProgramRun) -> None:
    cluster = eks_run.one(CLUSTER)
    spec = cluster.inputs["spec"]
    assert spec["instances"] == 2
    assert spec["imageName"] == versions.POSTGRESQL_IMAGE
    assert spec["storage"] == {"storageClass": "gp3-encrypted", "size": "50Gi"}
    assert set(spec["resources"]) == {"requests", "limits"}
    assert set(spec["resources"]["limits"]) == {"cpu", "memory"}
    # The operator's PodDisruptionBudget; a drain of the primary's node waits for a switchover.
    assert spec["enablePDB"] is True
    assert spec["enableSuperuserAccess"] is False
    # A commit waits for the replica while one is up: a failover loses nothing committed.
    assert spec["postgresql"]["synchronous"] == {
        "method": "any",
        "number": 1,
        "dataDurability": "preferred",
    }
    assert spec["affinity"]["enablePodAntiAffinity"] is True
    assert cluster.protect  # `pulumi destroy` or a replacement does not take the volumes along


def test_users_come_from_generated_secrets(eks_run: ProgramRun) -> None:
    spec = eks_run.one(CLUSTER).inputs["spec"]
    initdb = spec["bootstrap"]["initdb"]
    assert initdb == {
        "database": "gpu_profiler",
        "owner": "gpu_profiler",
        "secret": {"name": "gpu-profiler-store-writer"},
    }
    (reader,) = spec["managed"]["roles"]
    assert reader["name"] == "gpu_profiler_reader"
    assert reader["inRoles"] == ["pg_read_all_data"]
    assert reader["passwordSecret"] == {"name": "gpu-profiler-store-reader"}
    assert reader["login"] is True
    assert not {"superuser", "createdb", "createrole", "replication"} & {
        key for key, value in reader.items() if value is True
    }
    for name, user in (("writer", "gpu_profiler"), ("reader", "gpu_profiler_reader")):
        secret = named(eks_run, SECRET, f"gpu-profiler-store-{name}", "gpu-profiler-store")
        assert secret.inputs["type"] == "kubernetes.io/basic-auth"
        assert secret.inputs["stringData"] == {"username": user, "password": FAKE_PASSWORD}
        assert "stringData" in secret.secret_paths
        # The operator applies a changed password without a restart.
        assert secret.inputs["metadata"]["labels"] == {"cnpg.io/reload": "true"}


def test_the_daemon_gets_a_libpq_password_file(eks_run: ProgramRun) -> None:
    secret = named(eks_run, SECRET, "gpu-profiler-store", "gpu-profiler")
    assert secret.inputs["stringData"]["pgpass"] == f"*:*:*:gpu_profiler:{FAKE_PASSWORD}\n"
    assert "stringData" in secret.secret_paths
    annotations = eks_run.one(DAEMON_SET).get("spec.template.metadata.annotations")
    digest = annotations["gpu-cluster.io/store-credentials-sha256"]  # a new password rolls them
    assert digest == hashlib.sha256(FAKE_PASSWORD.encode()).hexdigest()


@pytest.mark.parametrize(
    ("user", "password", "line"),
    [
        ("gpu_profiler", "abc123", "*:*:*:gpu_profiler:abc123\n"),
        ("u", "a:b\\c", "*:*:*:u:a\\:b\\\\c\n"),  # libpq's escapes for ':' and '\'
    ],
)
def test_password_file_lines_escape_what_libpq_splits_on(
    user: str, password: str, line: str
) -> None:
    assert passfile_line(user, password) == line


def test_passwords_and_the_ca_key_are_secrets_and_nowhere_else(eks_run: ProgramRun) -> None:
    """Only Secrets hold a password or the CA's key, each marked secret for Pulumi's state (and
    the resources that generate them, whose results the providers mark secret)."""
    holders = []
    for resource in eks_run.resources:
        if resource.typ in GENERATORS:
            continue
        text = json.dumps(resource.inputs)
        if FAKE_PASSWORD in text or "PRIVATE KEY" in text:
            holders.append(resource)
            assert resource.typ == SECRET, resource.name
            assert "stringData" in resource.secret_paths, resource.name
    assert {r.inputs["metadata"]["name"] for r in holders} >= {
        "gpu-profiler-store-writer",
        "gpu-profiler-store-reader",
        "gpu-profiler-store-server-ca",
        "gpu-profiler-store",  # the daemon's copy of the writer's password
    }
    assert all(
        secret for _, (value, secret) in eks_run.outputs.items() if FAKE_PASSWORD in str(value)
    )


WORKLOADS = {
    "kubernetes:apps/v1:DaemonSet",
    "kubernetes:apps/v1:Deployment",
    "kubernetes:apps/v1:StatefulSet",
    "kubernetes:batch/v1:Job",
    "kubernetes:batch/v1:CronJob",
}


@pytest.mark.parametrize("stack", ["eks", "kubeadm"])
def test_no_workload_spec_is_a_secret(stack: str, request: pytest.FixtureRequest) -> None:
    """`pulumi preview` shows a secret input as [secret]: a workload's spec must stay plain so a
    change to it is reviewable (the credentials' digest annotation is unsecreted for this)."""
    run: ProgramRun = request.getfixturevalue(f"{stack}_run")
    workloads = [resource for resource in run.resources if resource.typ in WORKLOADS]
    assert any(resource.typ == "kubernetes:apps/v1:DaemonSet" for resource in workloads)
    for resource in workloads:
        hidden = {path for path in resource.secret_paths if path.split(".")[0] == "spec"}
        assert not hidden, (resource.name, hidden)


def test_pooler_is_pgbouncer_in_transaction_mode_with_tls_required(eks_run: ProgramRun) -> None:
    spec = eks_run.one(POOLER).inputs["spec"]
    assert spec["cluster"] == {"name": "gpu-profiler-store"}
    assert spec["type"] == "rw"
    assert spec["instances"] == 2
    assert spec["pgbouncer"]["poolMode"] == "transaction"
    assert spec["pgbouncer"]["image"] == versions.PGBOUNCER_IMAGE
    parameters = spec["pgbouncer"]["parameters"]
    assert parameters == POOLER_PARAMETERS
    assert parameters["client_tls_sslmode"] == "require"
    # Server connections stay within the writers benchmark's bound however many nodes write.
    assert int(parameters["max_db_connections"]) * spec["instances"] <= 50
    (container,) = spec["template"]["spec"]["containers"]
    assert container["name"] == "pgbouncer"  # the operator merges by this name
    assert set(container["resources"]) == {"requests", "limits"}
    budget = eks_run.one("kubernetes:policy/v1:PodDisruptionBudget").inputs
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == {
        "matchLabels": {"cnpg.io/poolerName": "gpu-profiler-store-pooler"}
    }


def test_server_certificate_names_cover_every_client(eks_run: ProgramRun) -> None:
    """CloudNativePG issues the server certificate (the pooler serves the same one) with the
    Cluster's serverAltDNSNames; verify-full checks the URL's host among them."""
    names = eks_run.one(CLUSTER).inputs["spec"]["certificates"]["serverAltDNSNames"]
    url = daemon_env(eks_run)["GPU_PROFILER_STORE_URL"]
    host = url.split("@", 1)[1].split(":", 1)[0]
    assert host == POOLER_HOST
    assert host in names
    assert datasource(eks_run)["url"] == f"{POOLER_HOST}:5432"
    assert f"{POOLER_HOST}.cluster.local" in names
    assert "sslmode=verify-full" in url
    assert f"sslrootcert={CA_FILE}" in url


def test_one_ca_signs_and_every_client_trusts_it(eks_run: ProgramRun) -> None:
    certificates = eks_run.one(CLUSTER).inputs["spec"]["certificates"]
    assert set(certificates) == {"serverCASecret", "serverAltDNSNames"}  # the operator signs
    server_ca = named(eks_run, SECRET, certificates["serverCASecret"], "gpu-profiler-store")
    assert server_ca.inputs["stringData"] == {
        "ca.crt": FAKE_CERTIFICATE,
        "ca.key": FAKE_PRIVATE_KEY,
    }
    for namespace in ("gpu-profiler", "monitoring", "gpu-profiler-store"):
        copy = named(eks_run, CONFIG_MAP, "gpu-profiler-store-ca", namespace)
        assert copy.inputs["data"] == {"ca.crt": FAKE_CERTIFICATE}
    key = eks_run.one("tls:index/privateKey:PrivateKey").inputs
    # CloudNativePG signs with an EC key in "EC PRIVATE KEY" PEM, what pulumi_tls writes for ECDSA.
    assert (key["algorithm"], key["ecdsaCurve"]) == ("ECDSA", "P256")
    ca = eks_run.one("tls:index/selfSignedCert:SelfSignedCert").inputs
    assert ca["isCaCertificate"] is True
    assert "cert_signing" in ca["allowedUses"]
    assert ca["validityPeriodHours"] > ca["earlyRenewalHours"] > 0


def test_operator_and_database_are_scraped(eks_run: ProgramRun) -> None:
    values = eks_run.release("cloudnative-pg").inputs["values"]
    assert values["monitoring"]["podMonitorEnabled"] is True
    assert values["monitoring"]["grafanaDashboard"] == {"create": True, "namespace": "monitoring"}
    monitors = {
        r.inputs["metadata"]["name"]: r.inputs["spec"] for r in eks_run.of_type(POD_MONITOR)
    }
    assert monitors["gpu-profiler-store"]["selector"] == {
        "matchLabels": {"cnpg.io/cluster": "gpu-profiler-store", "cnpg.io/podRole": "instance"}
    }
    assert monitors["gpu-profiler-store-pooler"]["podMetricsEndpoints"] == [{"port": "metrics"}]


def test_network_policies_admit_only_the_clients(eks_run: ProgramRun) -> None:
    def ingress(name: str) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
        spec = named(eks_run, NETWORK_POLICY, name, "gpu-profiler-store").inputs["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        rules = []
        for rule in spec["ingress"]:
            peers = tuple(
                p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                if "namespaceSelector" in p
                else "(same namespace)"
                for p in rule["from"]
            )
            rules.append((peers, tuple(p["port"] for p in rule["ports"])))
        return rules

    assert ingress("gpu-profiler-store-pooler") == [
        (("gpu-profiler", "monitoring"), (5432,)),
        (("monitoring",), (9127,)),
    ]
    # of the monitoring namespace, Grafana's pods alone reach the database
    pooler = named(eks_run, NETWORK_POLICY, "gpu-profiler-store-pooler", "gpu-profiler-store")
    profiler, grafana = pooler.inputs["spec"]["ingress"][0]["from"]
    assert "podSelector" not in profiler
    assert grafana["podSelector"] == {
        "matchLabels": {
            "app.kubernetes.io/name": "grafana",
            "app.kubernetes.io/instance": "kube-prometheus-stack",
        }
    }
    assert ingress("gpu-profiler-store") == [
        (("(same namespace)",), (5432, 8000)),
        (("cnpg-system",), (5432, 8000)),
        (("monitoring",), (9187,)),
    ]


def test_store_namespaces_enforce_restricted_pod_security(eks_run: ProgramRun) -> None:
    for name in ("gpu-profiler-store", "cnpg-system", "gpu-profiler"):
        labels = named(eks_run, NAMESPACE, name).inputs["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_daemons_wait_for_the_database(eks_run: ProgramRun) -> None:
    daemon_set = eks_run.one(DAEMON_SET)
    component = eks_run.one("gpu-cluster:index:GpuProfiler")
    assert eks_run.one(POOLER).urn in component.dependencies
    secret = named(eks_run, SECRET, "gpu-profiler-store", "gpu-profiler")
    assert secret.urn in daemon_set.dependencies


# -- storage ---------------------------------------------------------------------------------------


def test_kubeadm_installs_local_path_for_the_database(kubeadm_run: ProgramRun) -> None:
    # Its release manifest's objects (Rancher publishes no chart archive): no chart cache needed.
    assert not [r for r in kubeadm_run.releases() if "local-path" in r.inputs["name"]]
    deployment = named(
        kubeadm_run, "kubernetes:apps/v1:Deployment", "local-path-provisioner", "local-path-storage"
    )
    (container,) = deployment.get("spec.template.spec.containers")
    assert container["image"] == versions.LOCAL_PATH_PROVISIONER_IMAGE
    config = named(
        kubeadm_run, "kubernetes:core/v1:ConfigMap", "local-path-config", "local-path-storage"
    )
    helper = yaml.safe_load(config.inputs["data"]["helperPod.yaml"])
    assert helper["spec"]["containers"][0]["image"] == versions.LOCAL_PATH_HELPER_IMAGE
    (storage_class,) = kubeadm_run.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert storage_class.inputs["metadata"]["name"] == "local-path"
    assert storage_class.inputs["reclaimPolicy"] == "Retain"
    assert kubeadm_run.one(CLUSTER).inputs["spec"]["storage"]["storageClass"] == "local-path"
    assert deployment.urn in kubeadm_run.one(CLUSTER).dependencies


def test_kubeadm_database_on_a_storage_class_of_the_cluster() -> None:
    run = run_stack(
        KUBEADM_STACK, overrides={"profilerDatabase": {"storageClass": "ceph-rbd", "instances": 3}}
    )
    assert not run.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    spec = run.one(CLUSTER).inputs["spec"]
    assert spec["storage"]["storageClass"] == "ceph-rbd"
    assert spec["instances"] == 3


def test_eks_has_no_local_path_provisioner(eks_run: ProgramRun) -> None:
    classes = eks_run.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert "local-path" not in {c.inputs["metadata"]["name"] for c in classes}
