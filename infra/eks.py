"""GpuEksCluster: an EKS cluster with a small CPU system node group and tainted GPU node groups.

Besides the cluster and its node groups: the VPC CNI with network policy enforcement on, the EBS
CSI driver (Prometheus' volume) with its own IAM role, and on GPU nodes a container toolkit that
hands GPUs only to the pods the device plugin gives them to (see gpu_node_user_data).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from email.encoders import encode_7or8bit
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra import versions
from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_TAINT_KEY, GPU_TAINT_VALUE
from infra.gpu_sharing import CONFIG_LABEL
from infra.stack_config import ConfigError
from infra.storage import StorageClassSpec
from infra.vpc import Vpc, VpcArgs

# EKS-optimized Amazon Linux 2023 AMIs that ship the NVIDIA driver and container toolkit.
NVIDIA_AMI_TYPES = frozenset({"AL2023_x86_64_NVIDIA", "AL2023_ARM_64_NVIDIA"})
BOTTLEROCKET_AMI_PREFIX = "BOTTLEROCKET_"
# Prometheus' volume: encrypted gp3 through the EBS CSI driver (no default class since EKS 1.30).
EBS_STORAGE_CLASS = StorageClassSpec(
    name="gp3-encrypted",
    provisioner="ebs.csi.aws.com",
    parameters={"type": "gp3", "encrypted": "true"},
)
EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EBS_CSI_SERVICE_ACCOUNT = "system:serviceaccount:kube-system:ebs-csi-controller-sa"
# IMDSv2 answers reach the host's network namespace only (one hop): a pod on its own network (one
# hop more) gets no instance role credentials. What runs on GPU nodes does not need them: the VPC
# CNI, kube-proxy and the EFA device plugin use the host network, the EBS CSI node plugin falls
# back to the Kubernetes API for its metadata, and AWS-calling pods use IRSA. A workload that
# relies on the node's role from a pod network (no IRSA) would need 2.
GPU_NODE_IMDS_HOP_LIMIT = 1
# The settings kubeadm GPU nodes get: the device plugin's volume mounts are the only way
# to a GPU; NVIDIA_VISIBLE_DEVICES from an unprivileged container (every CUDA image sets it) is not.
TOOLKIT_SETTINGS = (
    "accept-nvidia-visible-devices-as-volume-mounts=true",
    "accept-nvidia-visible-devices-envvar-when-unprivileged=false",
)
USER_DATA_BOUNDARY = "==GPU-CLUSTER-USER-DATA=="
# nodeadm's configuration (EKS merges it with its own): instance-store NVMe disks as one RAID0
# array under /mnt/k8s-disks, where the kubelet and containerd keep pods' data and images.
NODE_CONFIG_TYPE = "node.eks.aws"
RAID0_NODE_CONFIG = """apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  instance:
    localStorage:
      strategy: RAID0
"""
# Managed node group capacity: on-demand (optionally in a capacity reservation), spot, or a
# Capacity Block for ML (a reservation of GPU instances for a fixed window).
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")
# Nodes of EFA groups and pools carry this label; the EFA device plugin runs there.
EFA_NODE_LABEL = "gpu-cluster.io/efa"
# EKS' node monitoring agent: node conditions for GPU (XID), network, storage and kernel faults,
# which Karpenter's node repair acts on.
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    # Pulling images only (ReadOnly also lists and describes every repository of the account).
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
)


@dataclass(frozen=True)
class NodeGroupArgs:
    """Size and machines of a managed node group."""

    instance_types: tuple[str, ...]
    min_size: int
    max_size: int
    desired_size: int
    disk_size_gib: int = 50


@dataclass(frozen=True)
class GpuNodeGroupArgs(NodeGroupArgs):
    """A GPU node group; its nodes are tainted nvidia.com/gpu=present:NoSchedule and labelled."""

    name: str = "gpu"
    ami_type: str = "AL2023_x86_64_NVIDIA"
    disk_size_gib: int = 200  # CUDA images are large
    capacity_type: str = "ON_DEMAND"
    # A capacity reservation (cr-...) to launch into: an on-demand capacity reservation, or the
    # Capacity Block of a CAPACITY_BLOCK group (required there).
    capacity_reservation_id: str | None = None
    # Only the private subnets of this zone (a reservation's or a placement group's zone).
    availability_zone: str | None = None
    # Subnets of the group instead of the cluster's private subnets (an existing VPC).
    subnet_ids: tuple[str, ...] = ()
    # EFA interfaces on every network card, in a cluster placement group of its own (one zone).
    efa: bool = False
    # Instance-store NVMe disks as one RAID0 array for pods' data and images (p4d, p5).
    instance_store_raid0: bool = False
    # The device plugin configuration its nodes use (infra/gpu_sharing.py); None: the default.
    device_plugin_config: str | None = None

    def __post_init__(self) -> None:
        if self.capacity_type not in CAPACITY_TYPES:
            raise ValueError(
                f"GPU node group {self.name!r}: capacityType must be one of "
                f"{', '.join(CAPACITY_TYPES)}, got {self.capacity_type!r}"
            )
        if self.capacity_type == "CAPACITY_BLOCK" and not self.capacity_reservation_id:
            raise ValueError(
                f"GPU node group {self.name!r}: capacityType CAPACITY_BLOCK needs "
                f"capacityReservationId (the Capacity Block's cr-... id)"
            )
        if self.capacity_reservation_id and self.capacity_type == "SPOT":
            raise ValueError(
                f"GPU node group {self.name!r}: a capacity reservation is not spot capacity"
            )
        if self.efa and not (self.availability_zone or self.subnet_ids):
            raise ValueError(
                f"GPU node group {self.name!r}: efa needs availabilityZone (or subnetIds of one "
                f"zone): a cluster placement group lies in one zone"
            )


@dataclass(frozen=True)
class ExistingVpcArgs:
    """A VPC to reuse instead of creating one."""

    vpc_id: str
    private_subnet_ids: tuple[str, ...]
    public_subnet_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuEksClusterArgs:
    """The cluster, its network and its node groups."""

    cluster_name: str
    gpu_node_groups: tuple[GpuNodeGroupArgs, ...]
    kubernetes_version: str = versions.KUBERNETES_VERSION
    vpc: VpcArgs = field(default_factory=VpcArgs)
    existing_vpc: ExistingVpcArgs | None = None
    system_node_group: NodeGroupArgs = field(
        default_factory=lambda: NodeGroupArgs(
            instance_types=("m6i.large",), min_size=1, max_size=3, desired_size=2
        )
    )
    # Who may reach the public API endpoint; narrow it to your office or VPN.
    public_access_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    # Karpenter provides GPU nodes (infra/karpenter): GPU node groups become optional.
    gpu_nodes_from_karpenter: bool = False

    def __post_init__(self) -> None:
        if not self.gpu_node_groups and not self.gpu_nodes_from_karpenter:
            raise ValueError(
                "a GPU cluster needs at least one GPU node group, or Karpenter's GPU NodePool"
            )
        if self.system_node_group.desired_size < 1:
            raise ValueError("the system node group needs at least one node (desiredSize >= 1)")
        for group in self.gpu_node_groups:
            if group.ami_type.startswith(BOTTLEROCKET_AMI_PREFIX):
                raise ValueError(
                    f"GPU node group {group.name!r}: {group.ami_type} is not supported: "
                    f"Bottlerocket runs its own NVIDIA device plugin (devices by index), which "
                    f"would run beside the chart's and break attribution of GPUs to pods by UUID; "
                    f"use "
                    f"{' or '.join(sorted(NVIDIA_AMI_TYPES))}"
                )
            if group.ami_type not in NVIDIA_AMI_TYPES:
                raise ValueError(
                    f"GPU node group {group.name!r}: AMI type {group.ami_type!r} has no NVIDIA "
                    f"driver; use one of {', '.join(sorted(NVIDIA_AMI_TYPES))}"
                )


def gpu_node_user_data(instance_store_raid0: bool = False) -> str:
    """MIME user data for GPU nodes: configure the NVIDIA container toolkit before kubelet starts,
    and with ``instance_store_raid0`` nodeadm's RAID0 of the instance-store disks.

    EKS merges it with its own nodeadm configuration (managed node groups need MIME multi-part).
    """
    settings = " ".join(f"--set {setting}" for setting in TOOLKIT_SETTINGS)
    script = (
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        "# GPUs only through the device plugin's volume mounts, never by environment variable.\n"
        f"nvidia-ctk config --in-place {settings}\n"
    )
    message = MIMEMultipart(boundary=USER_DATA_BOUNDARY)
    if instance_store_raid0:
        message.attach(
            MIMEApplication(RAID0_NODE_CONFIG, NODE_CONFIG_TYPE, _encoder=encode_7or8bit)
        )
    message.attach(MIMEText(script, "x-shellscript"))
    return message.as_string()


def irsa_trust_policy(provider_arn: str, provider_url: str, subject: str) -> str:
    issuer = provider_url.removeprefix("https://")
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Federated": provider_arn},
                    "Action": "sts:AssumeRoleWithWebIdentity",
                    "Condition": {
                        "StringEquals": {
                            f"{issuer}:sub": subject,
                            f"{issuer}:aud": "sts.amazonaws.com",
                        }
                    },
                }
            ],
        }
    )


def node_role(name: str, parent: pulumi.Resource, role_name: str | None = None) -> aws.iam.Role:
    """An EC2 role with the worker node policies (``role_name``: a fixed IAM name)."""
    role = aws.iam.Role(
        f"{name}-node-role",
        name=role_name,
        assume_role_policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "ec2.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                    }
                ],
            }
        ),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    for index, policy_arn in enumerate(NODE_POLICIES):
        aws.iam.RolePolicyAttachment(
            f"{name}-node-role-policy-{index}",
            role=role.name,
            policy_arn=policy_arn,
            opts=pulumi.ResourceOptions(parent=parent),
        )
    return role


class GpuEksCluster(pulumi.ComponentResource):
    """EKS with a CPU system node group and GPU managed node groups on NVIDIA AMIs."""

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    storage_class: StorageClassSpec = EBS_STORAGE_CLASS

    def __init__(
        self, name: str, args: GpuEksClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-cluster:index:GpuEksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        vpc_id: pulumi.Input[str]
        private_subnets: list[pulumi.Input[str]]
        public_subnets: list[pulumi.Input[str]]
        # The zone of each private subnet, where the stack creates them (unknown otherwise).
        self.private_subnet_zones: list[str] = []
        if args.existing_vpc is not None:
            vpc_id = args.existing_vpc.vpc_id
            private_subnets = list(args.existing_vpc.private_subnet_ids)
            public_subnets = list(args.existing_vpc.public_subnet_ids)
        else:
            vpc = Vpc(f"{name}-network", args.vpc, args.cluster_name, opts=child)
            vpc_id = vpc.vpc_id
            private_subnets = list(vpc.private_subnet_ids)
            public_subnets = list(vpc.public_subnet_ids)
            self.private_subnet_zones = vpc.zones

        role = node_role(name, self)
        self.vpc_id = pulumi.Output.from_input(vpc_id)
        self._cluster_name = args.cluster_name
        self.private_subnet_ids = private_subnets
        self.cluster = eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.kubernetes_version,
            vpc_id=vpc_id,
            private_subnet_ids=private_subnets,
            public_subnet_ids=public_subnets or None,
            skip_default_node_group=True,
            authentication_mode=eks.AuthenticationMode.API,
            endpoint_private_access=True,
            endpoint_public_access=True,
            public_access_cidrs=list(args.public_access_cidrs),
            node_associate_public_ip_address=False,
            create_oidc_provider=True,  # IAM roles for service accounts (the EBS CSI driver's)
            # Without it the VPC CNI ignores NetworkPolicy objects (the profiler's among them).
            vpc_cni_options=eks.VpcCniOptionsArgs(enable_network_policy=True),
            opts=child,
        )
        after_cluster = pulumi.ResourceOptions(parent=self, depends_on=[self.cluster])

        system = args.system_node_group
        self.system_node_group = eks.ManagedNodeGroup(
            f"{name}-system-nodes",
            cluster=self.cluster,
            node_role=role,
            subnet_ids=private_subnets,
            instance_types=list(system.instance_types),
            ami_type="AL2023_x86_64_STANDARD",
            disk_size=system.disk_size_gib,
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=system.min_size,
                max_size=system.max_size,
                desired_size=system.desired_size,
            ),
            labels={"node-role.gpu-cluster.io/system": "true"},
            opts=after_cluster,
        )
        self.gpu_node_groups = [
            self._gpu_node_group(name, group, role, private_subnets, after_cluster)
            for group in args.gpu_node_groups
        ]
        self.ebs_csi_driver = self._ebs_csi_driver(name, args.cluster_name)
        self.node_monitoring_agent = aws.eks.Addon(
            f"{name}-node-monitoring-agent",
            cluster_name=args.cluster_name,
            addon_name=NODE_MONITORING_AGENT,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.cluster, self.system_node_group]
            ),
        )

        self.cluster_name = pulumi.Output.from_input(args.cluster_name)
        self.kubeconfig = pulumi.Output.secret(self.cluster.kubeconfig_json)
        self.register_outputs({"cluster_name": self.cluster_name, "kubeconfig": self.kubeconfig})

    @property
    def ready(self) -> list[pulumi.Resource]:
        """What Kubernetes resources must wait for: every node group and the storage driver."""
        return [self.system_node_group, *self.gpu_node_groups, self.ebs_csi_driver]

    def _group_subnets(
        self, group: GpuNodeGroupArgs, subnets: list[pulumi.Input[str]]
    ) -> list[pulumi.Input[str]]:
        """The group's own subnets, those of its zone, or every private subnet."""
        if group.subnet_ids:
            return list(group.subnet_ids)
        if group.availability_zone is None:
            return subnets
        in_zone = [
            subnet
            for subnet, zone in zip(subnets, self.private_subnet_zones, strict=False)
            if zone == group.availability_zone
        ]
        if not in_zone:
            raise ConfigError(
                f"GPU node group {group.name!r}: availabilityZone {group.availability_zone} has "
                f"no private subnet of the stack's (zones: "
                f"{', '.join(self.private_subnet_zones) or 'unknown: give subnetIds'})"
            )
        return in_zone

    def _efa_settings(
        self, name: str, cluster_name: str, group: GpuNodeGroupArgs
    ) -> dict[str, Any]:
        """Launch template settings of an EFA group: a cluster placement group, and an EFA
        interface on every network card of the instance type (EFA-only beyond the first)."""
        placement_group = aws.ec2.PlacementGroup(
            f"{name}-{group.name}-placement-group",
            name=f"{cluster_name}-{group.name}-efa",
            strategy="cluster",
            opts=pulumi.ResourceOptions(parent=self),
        )
        instance_type = aws.ec2.get_instance_type_output(
            instance_type=group.instance_types[0],
            opts=pulumi.InvokeOutputOptions(parent=self),
        )
        security_groups = [self.cluster.cluster_security_group_id]

        def interfaces(cards: int) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
            return [
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=card,
                    device_index=0 if card == 0 else 1,
                    interface_type="efa" if card == 0 else "efa-only",
                    security_groups=security_groups,
                    delete_on_termination="true",
                )
                for card in range(max(cards, 1))
            ]

        return {
            "placement": aws.ec2.LaunchTemplatePlacementArgs(group_name=placement_group.name),
            "network_interfaces": instance_type.maximum_network_cards.apply(interfaces),
        }

    def _gpu_node_group(
        self,
        name: str,
        group: GpuNodeGroupArgs,
        node_role: aws.iam.Role,
        subnets: list[pulumi.Input[str]],
        opts: pulumi.ResourceOptions,
    ) -> eks.ManagedNodeGroup:
        capacity: dict[str, Any] = {}
        if group.capacity_reservation_id:
            capacity["capacity_reservation_specification"] = (
                aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                    capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                        capacity_reservation_id=group.capacity_reservation_id
                    )
                )
            )
        if group.capacity_type == "CAPACITY_BLOCK":
            capacity["instance_market_options"] = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
                market_type="capacity-block"
            )
        efa = self._efa_settings(name, self._cluster_name, group) if group.efa else {}
        user_data = gpu_node_user_data(group.instance_store_raid0)
        labels = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE}
        if group.efa:
            labels[EFA_NODE_LABEL] = "true"
        if group.device_plugin_config is not None:
            labels[CONFIG_LABEL] = group.device_plugin_config
        # The launch template carries the toolkit settings; with one, the disk size goes there too.
        template = aws.ec2.LaunchTemplate(
            f"{name}-{group.name}-launch-template",
            user_data=base64.b64encode(user_data.encode()).decode(),
            **capacity,
            **efa,
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name="/dev/xvda",
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=group.disk_size_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=GPU_NODE_IMDS_HOP_LIMIT,
            ),
            update_default_version=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return eks.ManagedNodeGroup(
            f"{name}-{group.name}-nodes",
            cluster=self.cluster,
            node_role=node_role,
            subnet_ids=self._group_subnets(group, subnets),
            instance_types=list(group.instance_types),
            ami_type=group.ami_type,
            capacity_type=group.capacity_type,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=group.min_size,
                max_size=group.max_size,
                desired_size=group.desired_size,
            ),
            labels=labels,
            taints=[
                aws.eks.NodeGroupTaintArgs(
                    key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect="NO_SCHEDULE"
                )
            ],
            opts=opts,
        )

    def _ebs_csi_driver(self, name: str, cluster_name: str) -> aws.eks.Addon:
        """The EBS CSI driver add-on, its controller allowed EBS calls through its own IAM role."""
        role = aws.iam.Role(
            f"{name}-ebs-csi-role",
            assume_role_policy=pulumi.Output.all(
                self.cluster.oidc_provider_arn, self.cluster.oidc_provider_url
            ).apply(lambda oidc: irsa_trust_policy(oidc[0], oidc[1], EBS_CSI_SERVICE_ACCOUNT)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        attachment = aws.iam.RolePolicyAttachment(
            f"{name}-ebs-csi-policy",
            role=role.name,
            policy_arn=EBS_CSI_POLICY,
            opts=pulumi.ResourceOptions(parent=self),
        )
        # Its controller needs a node to run on before the add-on reports active.
        return aws.eks.Addon(
            f"{name}-ebs-csi-driver",
            cluster_name=cluster_name,
            addon_name="aws-ebs-csi-driver",
            service_account_role_arn=role.arn,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.cluster, self.system_node_group, attachment]
            ),
        )
