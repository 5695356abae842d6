"""The ``rds`` store of the EKS stack under Pulumi mocks (a test double, see
tests/infra/store_objects.py): a private, encrypted, protected instance whose master password
stays in Secrets Manager, reachable from the cluster's nodes only, its users made by a Job that
alone reads that password, its clients verifying the instance."""

from __future__ import annotations

import json

import pytest

from infra import versions
from infra.render.program import (
    FAKE_CERTIFICATE,
    FAKE_CLUSTER_SECURITY_GROUP,
    ProgramRun,
    mock_id,
    run_stack,
)
from tests.infra.conftest import EKS_STACK
from tests.infra.store_objects import CA_FILE, CLUSTER, CONFIG_MAP, daemon_env, datasource, named

RDS_INSTANCE = "aws:rds/instance:Instance"
RDS_HOST = "gpu-profiler-store.abcdefghijkl.us-west-2.rds.amazonaws.com"


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
