"""The profiler's store in both stacks under Pulumi mocks, for each ``profilerStore``.

Test double: Pulumi's mock engine instead of the Pulumi CLI, AWS and a Kubernetes API server
(infra/render/program.py); generated passwords, keys and certificates are placeholders. What the
objects become in a cluster (schemas against the CloudNativePG chart's CRDs, Services, scheduling,
volume claims, Secret wiring) is checked on the rendered graph in test_render_store.py; the
connection the daemon makes from this wiring runs against a real PostgreSQL and PgBouncer in
tests/integration/test_store_wiring.py.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pulumi
import pytest
import yaml

from infra import versions
from infra.render.program import (
    FAKE_CERTIFICATE,
    FAKE_CLUSTER_SECURITY_GROUP,
    FAKE_PASSWORD,
    FAKE_PRIVATE_KEY,
    ProgramRun,
    Recorded,
    mock_id,
    run_stack,
)
from infra.store.cloudnative_pg import POOLER_PARAMETERS
from infra.store.daemon import passfile_line
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK

CLUSTER = "kubernetes:postgresql.cnpg.io/v1:Cluster"
POOLER = "kubernetes:postgresql.cnpg.io/v1:Pooler"
POD_MONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
SECRET = "kubernetes:core/v1:Secret"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NAMESPACE = "kubernetes:core/v1:Namespace"
DAEMON_SET = "kubernetes:apps/v1:DaemonSet"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
RDS_INSTANCE = "aws:rds/instance:Instance"
POOLER_HOST = "gpu-profiler-store-pooler.gpu-profiler-store.svc"
RDS_HOST = "gpu-profiler-store.abcdefghijkl.us-west-2.rds.amazonaws.com"
CA_FILE = "/etc/gpu-profiler/store-ca/ca.crt"
GENERATORS = frozenset(
    {
        "random:index/randomPassword:RandomPassword",
        "tls:index/privateKey:PrivateKey",
        "tls:index/selfSignedCert:SelfSignedCert",
    }
)


def daemon_env(run: ProgramRun) -> dict[str, Any]:
    (container,) = run.one(DAEMON_SET).get("spec.template.spec.containers")
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def named(run: ProgramRun, typ: str, name: str, namespace: str | None = None) -> Recorded:
    found = [
        r
        for r in run.of_type(typ)
        if r.inputs["metadata"]["name"] == name
        and (namespace is None or r.inputs["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"{typ} {namespace}/{name}: {len(found)} found"
    return found[0]


def datasource(run: ProgramRun) -> dict[str, Any]:
    config_map = named(run, CONFIG_MAP, "grafana-datasource-gpu-profiler-store")
    assert config_map.inputs["metadata"]["labels"] == {"grafana_datasource": "1"}
    (source,) = yaml.safe_load(config_map.inputs["data"]["gpu-profiler-store.yaml"])["datasources"]
    found: dict[str, Any] = source
    return found


# -- cloudnative-pg, the default ------------------------------------------------------------------


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


# -- rds -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rds_run() -> ProgramRun:
    return run_stack(EKS_STACK, overrides={"profilerStore": "rds"})


def test_rds_instance_is_private_encrypted_backed_up_and_protected(rds_run: ProgramRun) -> None:
    instance = rds_run.one(RDS_INSTANCE).inputs
    assert instance["engine"] == "postgres"
    assert instance["storageEncrypted"] is True
    assert instance["backupRetentionPeriod"] >= 1
    assert instance["deletionProtection"] is True
    assert instance["publiclyAccessible"] is False
    assert instance["skipFinalSnapshot"] is False
    # RDS keeps the master password in Secrets Manager: no password input, nothing in state.
    assert instance["manageMasterUserPassword"] is True
    assert not {"password", "passwordWo"} & set(instance)
    subnets = rds_run.one("aws:rds/subnetGroup:SubnetGroup").inputs
    private = [r for r in rds_run.of_type("aws:ec2/subnet:Subnet") if "private" in r.name]
    assert sorted(subnets["subnetIds"]) == sorted(mock_id(r.typ, r.name) for r in private)
    parameters = rds_run.one("aws:rds/parameterGroup:ParameterGroup").inputs
    assert {(p["name"], p["value"]) for p in parameters["parameters"]} == {
        ("rds.force_ssl", "1"),
        ("password_encryption", "scram-sha-256"),
    }


def test_rds_admits_the_cluster_nodes_only(rds_run: ProgramRun) -> None:
    group = rds_run.one("aws:ec2/securityGroup:SecurityGroup", "profiler-store-rds-security-group")
    (rule,) = group.inputs["ingress"]
    assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 5432, 5432)
    assert rule["securityGroups"] == [FAKE_CLUSTER_SECURITY_GROUP]  # EKS's cluster group
    assert not rule.get("cidrBlocks")
    assert group.inputs["egress"] == []


def test_rds_clients_verify_the_instance_and_use_their_own_users(rds_run: ProgramRun) -> None:
    env = daemon_env(rds_run)
    assert env["GPU_PROFILER_STORE_URL"] == (
        f"postgresql://gpu_profiler@{RDS_HOST}:5432/gpu_profiler"
        f"?sslmode=verify-full&sslrootcert={CA_FILE}"
    )
    assert env["PGPASSFILE"] == "/run/gpu-profiler/pgpass"
    command = rds_run.one("command:local:Command", "profiler-store-rds-ca-bundle").inputs
    assert command["create"].endswith("-m infra.store.rds_ca us-west-2")
    ca = named(rds_run, CONFIG_MAP, "gpu-profiler-store-ca", "gpu-profiler")
    assert ca.inputs["data"] == {"ca.crt": FAKE_CERTIFICATE}  # the command's output
    source = datasource(rds_run)
    assert source["url"] == f"{RDS_HOST}:5432"
    assert source["user"] == "gpu_profiler_reader"
    assert rds_run.outputs["profilerStore"] == ("rds", False)
    assert not rds_run.of_type(CLUSTER)
    assert not [r for r in rds_run.releases() if r.inputs["name"] == "cloudnative-pg"]


def test_rds_users_are_made_by_a_job_that_alone_reads_the_master_secret(
    rds_run: ProgramRun,
) -> None:
    job = rds_run.one("kubernetes:batch/v1:Job").inputs
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-profiler-store-roles"
    # IRSA's web identity token only (EKS' webhook projects it): no Kubernetes API token, and
    # no RBAC binding names the account, so it writes nothing in the cluster.
    assert pod["automountServiceAccountToken"] is False
    assert not [
        b
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in rds_run.of_type(f"kubernetes:rbac.authorization.k8s.io/v1:{kind}")
        if any(s["name"] == "gpu-profiler-store-roles" for s in b.inputs.get("subjects") or [])
    ]
    (fetch,) = pod["initContainers"]
    assert fetch["image"] == versions.AWS_CLI_IMAGE
    (roles,) = pod["containers"]
    assert roles["command"] == ["python", "/opt/rds-roles/rds_roles.py"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in roles["env"]}
    assert env["PGHOST"] == RDS_HOST
    assert env["WRITER_SECRET_DIR"] == "/etc/rds-roles/writer"
    assert not [e for e in roles["env"] if "valueFrom" in e]  # passwords as files, not variables
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["writer"]["secret"]["secretName"] == "gpu-profiler-store-writer"
    assert volumes["master"]["emptyDir"]["medium"] == "Memory"
    for container in (fetch, roles):
        assert container["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    account = named(rds_run, "kubernetes:core/v1:ServiceAccount", "gpu-profiler-store-roles")
    role = rds_run.one("aws:iam/role:Role", "profiler-store-roles-role")
    assert account.inputs["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": role.inputs["arn"]
    }
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert "system:serviceaccount:gpu-profiler-store:gpu-profiler-store-roles" in (
        statement["Condition"]["StringEquals"].values()
    )
    policy = json.loads(
        rds_run.one("aws:iam/rolePolicy:RolePolicy", "profiler-store-roles-policy").inputs["policy"]
    )
    assert policy["Statement"] == [
        {
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": "arn:aws:secretsmanager:us-west-2:123456789012:secret:rds!db-0",
        }
    ]


def test_rds_options_are_read(rds_run: ProgramRun) -> None:
    run = run_stack(
        EKS_STACK,
        overrides={
            "profilerStore": "rds",
            "profilerRds": {
                "instanceClass": "db.r7g.large",
                "multiAz": True,
                "engineVersion": "17",
            },
        },
    )
    instance = run.one(RDS_INSTANCE).inputs
    assert (instance["instanceClass"], instance["multiAz"], instance["engineVersion"]) == (
        "db.r7g.large",
        True,
        "17",
    )
    assert run.one("aws:rds/parameterGroup:ParameterGroup").inputs["family"] == "postgres17"


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
