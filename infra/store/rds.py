"""The profiler's store on Amazon RDS for PostgreSQL (``profilerStore: rds``, EKS only).

``RdsDatabase`` (AWS): the instance in a subnet group on the cluster's private subnets, behind a
security group that admits PostgreSQL from the cluster's nodes only (the EKS cluster security
group, which managed node groups and Karpenter's nodes carry), storage encrypted, automated
backups, deletion protection, TLS required (``rds.force_ssl``). The master password is RDS's own
in Secrets Manager (``manage_master_user_password``): Pulumi never sees it, and RDS rotates it.
The CA bundle clients verify RDS against is fetched once by ``pulumi up``
(``infra/store/rds_ca.py``).

``RdsRoles`` (Kubernetes): a Job in the cluster, which reaches the private instance, reads the
master secret with an IAM role only it may assume (IRSA) and creates the database, the writer
(its owner) and the read-only reader with the stack's generated passwords
(``infra/store/rds_roles.py``). It runs again whenever a password, the script or the instance
changes. The daemons and Grafana use those two users, never the master.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_command as command
import pulumi_kubernetes as k8s

from infra import versions
from infra.eks import GpuEksCluster, irsa_trust_policy
from infra.platform import namespace_name
from infra.security import non_root_pod_security
from infra.store.endpoint import (
    CA_CONFIG_MAP,
    CA_KEY,
    DATABASE,
    PASSWORD_KEY,
    POSTGRESQL_PORT,
    USERNAME_KEY,
    DatabaseUser,
    StoreEndpoint,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
MASTER_USER = "gpu_profiler_admin"
BOOTSTRAP_NAME = "gpu-profiler-store-roles"
BOOTSTRAP_USER = 65532  # the profiler image's user; the AWS CLI runs as it too
READER_CONNECTION_LIMIT = 20
SCRIPT_FILE = "rds_roles.py"
SCRIPT_DIR = "/opt/rds-roles"
MASTER_DIR = "/run/rds-master"
CA_DIR = "/etc/rds-ca"
SECRETS_DIR = "/etc/rds-roles"


@dataclass(frozen=True)
class RdsNetwork:
    """Where the database goes, and who may reach it: the EKS cluster's network and identity."""

    region: str
    vpc_id: pulumi.Input[str]
    subnet_ids: list[pulumi.Input[str]]
    node_security_group_id: pulumi.Input[str]  # the EKS cluster security group
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]


@dataclass(frozen=True)
class RdsArgs:
    identifier: str = "gpu-profiler-store"
    instance_class: str = "db.t4g.medium"
    allocated_storage_gib: int = 50
    max_allocated_storage_gib: int = 200  # storage autoscaling up to this
    engine_version: str = versions.RDS_POSTGRESQL_VERSION
    parameter_group_family: str = versions.RDS_PARAMETER_GROUP_FAMILY
    backup_retention_days: int = 7
    multi_az: bool = False
    deletion_protection: bool = True
    namespace: str = "gpu-profiler-store"  # the bootstrap Job's
    bootstrap_image: str = versions.PROFILER_IMAGE
    aws_cli_image: str = versions.AWS_CLI_IMAGE

    def __post_init__(self) -> None:
        if not 1 <= self.backup_retention_days <= 35:
            raise ValueError(
                f"backupRetentionDays must be 1-35 (automated backups stay on), got "
                f"{self.backup_retention_days}"
            )
        if self.max_allocated_storage_gib < self.allocated_storage_gib:
            raise ValueError(
                "maxAllocatedStorageGib must be at least allocatedStorageGib "
                f"({self.allocated_storage_gib}), got {self.max_allocated_storage_gib}"
            )


def eks_rds_network(cluster: GpuEksCluster, region: str) -> RdsNetwork:
    """The network of an RDS database for ``cluster``: its VPC and private subnets, and the
    security group EKS gives the cluster (its managed nodes and Karpenter's carry it)."""
    described = aws.eks.get_cluster_output(
        name=cluster.cluster_name, opts=pulumi.InvokeOutputOptions(depends_on=[cluster.cluster])
    )
    return RdsNetwork(
        region=region,
        vpc_id=cluster.vpc_id,
        subnet_ids=list(cluster.private_subnet_ids),
        node_security_group_id=described.vpc_config.cluster_security_group_id,
        oidc_provider_arn=cluster.cluster.oidc_provider_arn,
        oidc_provider_url=cluster.cluster.oidc_provider_url,
    )


class RdsDatabase(pulumi.ComponentResource):
    """The RDS instance, its subnet group, security group and parameter group; the CA bundle."""

    endpoint: StoreEndpoint
    master_secret_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: RdsArgs,
        network: RdsNetwork,
        *,
        writer: DatabaseUser,
        reader: DatabaseUser,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:RdsDatabase", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        subnets = aws.rds.SubnetGroup(
            f"{name}-subnets",
            subnet_ids=network.subnet_ids,
            description="gpu-profiler store: the cluster's private subnets",
            opts=child,
        )
        security_group = aws.ec2.SecurityGroup(
            f"{name}-security-group",
            vpc_id=network.vpc_id,
            description="gpu-profiler store: PostgreSQL from the cluster's nodes only",
            ingress=[
                aws.ec2.SecurityGroupIngressArgs(
                    description="PostgreSQL from the EKS cluster security group (its nodes)",
                    protocol="tcp",
                    from_port=POSTGRESQL_PORT,
                    to_port=POSTGRESQL_PORT,
                    security_groups=[network.node_security_group_id],
                )
            ],
            egress=[],  # the database starts no connection
            opts=child,
        )
        parameters = aws.rds.ParameterGroup(
            f"{name}-parameters",
            family=args.parameter_group_family,
            description="gpu-profiler store: TLS only, SCRAM passwords",
            parameters=[
                aws.rds.ParameterGroupParameterArgs(name="rds.force_ssl", value="1"),
                aws.rds.ParameterGroupParameterArgs(
                    name="password_encryption", value="scram-sha-256"
                ),
            ],
            opts=child,
        )
        self.instance = aws.rds.Instance(
            f"{name}-instance",
            identifier=args.identifier,
            engine="postgres",
            engine_version=args.engine_version,
            instance_class=args.instance_class,
            allocated_storage=args.allocated_storage_gib,
            max_allocated_storage=args.max_allocated_storage_gib,
            storage_type="gp3",
            storage_encrypted=True,
            username=MASTER_USER,
            manage_master_user_password=True,
            db_subnet_group_name=subnets.name,
            vpc_security_group_ids=[security_group.id],
            parameter_group_name=parameters.name,
            publicly_accessible=False,
            multi_az=args.multi_az,
            backup_retention_period=args.backup_retention_days,
            copy_tags_to_snapshot=True,
            deletion_protection=args.deletion_protection,
            skip_final_snapshot=False,
            final_snapshot_identifier=f"{args.identifier}-final",
            auto_minor_version_upgrade=True,
            enabled_cloudwatch_logs_exports=["postgresql"],
            opts=child,
        )
        # Once, where `pulumi up` runs: the bundle is public, and its CAs live for decades.
        bundle = command.local.Command(
            f"{name}-ca-bundle",
            create=f"{shlex.quote(sys.executable)} -m infra.store.rds_ca {network.region}",
            dir=str(REPO_ROOT),
            logging=command.local.Logging.STDERR,
            opts=child,
        )
        self.master_secret_arn = self.instance.master_user_secrets.apply(
            lambda secrets: str(secrets[0].secret_arn)
        )
        self.endpoint = StoreEndpoint(
            host=self.instance.address,
            port=POSTGRESQL_PORT,
            database=DATABASE,
            writer=writer,
            reader=reader,
            ca_certificate=bundle.stdout,
        )
        self.register_outputs({"host": self.instance.address, "ca_bundle": bundle.stdout})


def _script() -> str:
    return resources.files("infra.store").joinpath(SCRIPT_FILE).read_text(encoding="utf-8")


def secret_reader_policy(secret_arn: str) -> str:
    """Reading the master secret, and nothing else."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "secretsmanager:GetSecretValue",
                    "Resource": secret_arn,
                }
            ],
        }
    )


class RdsRoles(pulumi.ComponentResource):
    """The bootstrap Job that creates the database and its two users on the instance.

    Pass the Kubernetes provider in ``opts``.
    """

    def __init__(
        self,
        name: str,
        args: RdsArgs,
        database: RdsDatabase,
        network: RdsNetwork,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:RdsRoles", name, None, opts)
        endpoint = database.endpoint
        ns = k8s.core.v1.Namespace(
            "rds-roles-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.namespace, labels={"pod-security.kubernetes.io/enforce": "restricted"}
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        namespace = namespace_name(ns)
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[ns])

        def meta(
            object_name: str, annotations: dict[str, pulumi.Input[str]] | None = None
        ) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(
                name=object_name, namespace=namespace, annotations=annotations
            )

        subject = f"system:serviceaccount:{args.namespace}:{BOOTSTRAP_NAME}"
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=pulumi.Output.all(
                network.oidc_provider_arn, network.oidc_provider_url
            ).apply(lambda oidc: irsa_trust_policy(oidc[0], oidc[1], subject)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=database.master_secret_arn.apply(secret_reader_policy),
            opts=pulumi.ResourceOptions(parent=self),
        )
        account = k8s.core.v1.ServiceAccount(
            "rds-roles-service-account",
            metadata=meta(BOOTSTRAP_NAME, {"eks.amazonaws.com/role-arn": role.arn}),
            opts=in_namespace,
        )
        secrets = {
            user: k8s.core.v1.Secret(
                f"rds-{user}-secret",
                metadata=meta(f"gpu-profiler-store-{user}"),
                type="kubernetes.io/basic-auth",
                string_data={
                    USERNAME_KEY: db_user.name,
                    PASSWORD_KEY: db_user.password,
                },
                opts=in_namespace,
            )
            for user, db_user in (("writer", endpoint.writer), ("reader", endpoint.reader))
        }
        script = k8s.core.v1.ConfigMap(
            "rds-roles-script",
            metadata=meta(BOOTSTRAP_NAME),
            data={SCRIPT_FILE: _script()},
            opts=in_namespace,
        )
        ca = k8s.core.v1.ConfigMap(
            "rds-roles-ca",
            metadata=meta(CA_CONFIG_MAP),
            data={CA_KEY: endpoint.ca_certificate},
            opts=in_namespace,
        )
        # A new Job (the template is immutable) when anything it sets changes: the passwords (as
        # a digest), the script, the instance, the CA.
        digest = pulumi.Output.all(
            endpoint.writer.password,
            endpoint.reader.password,
            endpoint.host,
            endpoint.ca_certificate,
            database.master_secret_arn,
        ).apply(lambda parts: hashlib.sha256("\0".join([*map(str, parts), _script()]).encode()))
        self.job = k8s.batch.v1.Job(
            "rds-roles-job",
            metadata=meta(BOOTSTRAP_NAME),
            spec=self._job_spec(
                args,
                endpoint,
                secrets=secrets,
                digest=digest.apply(lambda d: d.hexdigest()),
                master_secret_arn=database.master_secret_arn,
                script=script,
                ca=ca,
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[account, script, ca, *secrets.values()],
                replace_on_changes=["spec"],
                delete_before_replace=True,
            ),
        )
        self.register_outputs({})

    @staticmethod
    def _job_spec(
        args: RdsArgs,
        endpoint: StoreEndpoint,
        *,
        secrets: dict[str, k8s.core.v1.Secret],
        digest: pulumi.Output[str],
        master_secret_arn: pulumi.Output[str],
        script: k8s.core.v1.ConfigMap,
        ca: k8s.core.v1.ConfigMap,
    ) -> k8s.batch.v1.JobSpecArgs:
        def secret_volume(user: str) -> k8s.core.v1.VolumeArgs:
            return k8s.core.v1.VolumeArgs(
                name=user,
                secret=k8s.core.v1.SecretVolumeSourceArgs(
                    secret_name=secrets[user].metadata.apply(lambda m: m.name), default_mode=0o400
                ),
            )

        restricted = k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            run_as_non_root=True,
            run_as_user=BOOTSTRAP_USER,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        )
        resources_ = k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "50m", "memory": "64Mi"}, limits={"cpu": "500m", "memory": "256Mi"}
        )
        master = k8s.core.v1.VolumeMountArgs(name="master", mount_path=MASTER_DIR)
        fetch_master = k8s.core.v1.ContainerArgs(
            name="master-secret",
            image=args.aws_cli_image,
            command=[
                "/bin/sh",
                "-c",
                'aws secretsmanager get-secret-value --secret-id "$MASTER_SECRET_ARN" '
                f"--query SecretString --output text > {MASTER_DIR}/secret.json",
            ],
            env=[
                k8s.core.v1.EnvVarArgs(name="MASTER_SECRET_ARN", value=master_secret_arn),
                k8s.core.v1.EnvVarArgs(name="HOME", value="/tmp"),  # noqa: S108
            ],
            volume_mounts=[master, k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp")],  # noqa: S108
            resources=resources_,
            security_context=restricted,
        )
        create_roles = k8s.core.v1.ContainerArgs(
            name="roles",
            image=args.bootstrap_image,
            command=["python", f"{SCRIPT_DIR}/{SCRIPT_FILE}"],
            env=[
                k8s.core.v1.EnvVarArgs(name="PGHOST", value=endpoint.host),
                k8s.core.v1.EnvVarArgs(name="PGPORT", value=str(endpoint.port)),
                k8s.core.v1.EnvVarArgs(name="PGSSLROOTCERT", value=f"{CA_DIR}/{CA_KEY}"),
                k8s.core.v1.EnvVarArgs(
                    name="MASTER_SECRET_FILE", value=f"{MASTER_DIR}/secret.json"
                ),
                k8s.core.v1.EnvVarArgs(name="STORE_DATABASE", value=endpoint.database),
                *(
                    k8s.core.v1.EnvVarArgs(
                        name=f"{user.upper()}_SECRET_DIR", value=f"{SECRETS_DIR}/{user}"
                    )
                    for user in secrets
                ),
                k8s.core.v1.EnvVarArgs(
                    name="READER_CONNECTION_LIMIT", value=str(READER_CONNECTION_LIMIT)
                ),
            ],
            volume_mounts=[
                master,
                k8s.core.v1.VolumeMountArgs(name="script", mount_path=SCRIPT_DIR, read_only=True),
                k8s.core.v1.VolumeMountArgs(name="ca", mount_path=CA_DIR, read_only=True),
                *(
                    k8s.core.v1.VolumeMountArgs(
                        name=user, mount_path=f"{SECRETS_DIR}/{user}", read_only=True
                    )
                    for user in secrets
                ),
            ],
            resources=resources_,
            security_context=restricted,
        )
        return k8s.batch.v1.JobSpecArgs(
            backoff_limit=6,
            active_deadline_seconds=900,
            template=k8s.core.v1.PodTemplateSpecArgs(
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    labels={"app.kubernetes.io/name": BOOTSTRAP_NAME},
                    annotations={"gpu-cluster.io/inputs-sha256": digest},
                ),
                spec=k8s.core.v1.PodSpecArgs(
                    service_account_name=BOOTSTRAP_NAME,
                    # It calls no Kubernetes API: no token of it in the pod. IRSA's web identity
                    # token is a projected volume of its own, which EKS's webhook adds anyway.
                    automount_service_account_token=False,
                    restart_policy="OnFailure",
                    security_context=non_root_pod_security(BOOTSTRAP_USER),
                    init_containers=[fetch_master],
                    containers=[create_roles],
                    volumes=[
                        # The master password never touches a disk.
                        k8s.core.v1.VolumeArgs(
                            name="master",
                            empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(
                                medium="Memory", size_limit="1Mi"
                            ),
                        ),
                        k8s.core.v1.VolumeArgs(
                            name="tmp",
                            empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="64Mi"),
                        ),
                        k8s.core.v1.VolumeArgs(
                            name="script",
                            config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                                name=script.metadata.apply(lambda m: m.name)
                            ),
                        ),
                        k8s.core.v1.VolumeArgs(
                            name="ca",
                            config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                                name=ca.metadata.apply(lambda m: m.name)
                            ),
                        ),
                        *(secret_volume(user) for user in secrets),
                    ],
                ),
            ),
        )
