"""GpuEksCluster: an EKS cluster with a small CPU system node group and tainted GPU node groups."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra import versions
from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_TAINT_KEY, GPU_TAINT_VALUE
from infra.vpc import Vpc, VpcArgs

# EKS-optimized AMIs that ship the NVIDIA driver and container toolkit.
NVIDIA_AMI_TYPES = frozenset(
    {
        "AL2023_x86_64_NVIDIA",
        "AL2023_ARM_64_NVIDIA",
        "BOTTLEROCKET_x86_64_NVIDIA",
        "BOTTLEROCKET_ARM_64_NVIDIA",
    }
)
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
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

    def __post_init__(self) -> None:
        if not self.gpu_node_groups:
            raise ValueError("a GPU cluster needs at least one GPU node group")
        for group in self.gpu_node_groups:
            if group.ami_type not in NVIDIA_AMI_TYPES:
                raise ValueError(
                    f"GPU node group {group.name!r}: AMI type {group.ami_type!r} has no NVIDIA "
                    f"driver; use one of {', '.join(sorted(NVIDIA_AMI_TYPES))}"
                )


def _node_role(name: str, parent: pulumi.Resource) -> aws.iam.Role:
    role = aws.iam.Role(
        f"{name}-node-role",
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

    def __init__(
        self, name: str, args: GpuEksClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-cluster:index:GpuEksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        vpc_id: pulumi.Input[str]
        private_subnets: list[pulumi.Input[str]]
        public_subnets: list[pulumi.Input[str]]
        if args.existing_vpc is not None:
            vpc_id = args.existing_vpc.vpc_id
            private_subnets = list(args.existing_vpc.private_subnet_ids)
            public_subnets = list(args.existing_vpc.public_subnet_ids)
        else:
            vpc = Vpc(f"{name}-network", args.vpc, args.cluster_name, opts=child)
            vpc_id = vpc.vpc_id
            private_subnets = list(vpc.private_subnet_ids)
            public_subnets = list(vpc.public_subnet_ids)

        node_role = _node_role(name, self)
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
            opts=child,
        )
        after_cluster = pulumi.ResourceOptions(parent=self, depends_on=[self.cluster])

        system = args.system_node_group
        self.system_node_group = eks.ManagedNodeGroup(
            f"{name}-system-nodes",
            cluster=self.cluster,
            node_role=node_role,
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
            eks.ManagedNodeGroup(
                f"{name}-{group.name}-nodes",
                cluster=self.cluster,
                node_role=node_role,
                subnet_ids=private_subnets,
                instance_types=list(group.instance_types),
                ami_type=group.ami_type,
                capacity_type=group.capacity_type,
                disk_size=group.disk_size_gib,
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                    min_size=group.min_size,
                    max_size=group.max_size,
                    desired_size=group.desired_size,
                ),
                labels={GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE},
                taints=[
                    aws.eks.NodeGroupTaintArgs(
                        key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect="NO_SCHEDULE"
                    )
                ],
                opts=after_cluster,
            )
            for group in args.gpu_node_groups
        ]

        self.cluster_name = pulumi.Output.from_input(args.cluster_name)
        self.kubeconfig = pulumi.Output.secret(self.cluster.kubeconfig_json)
        self.register_outputs({"cluster_name": self.cluster_name, "kubeconfig": self.kubeconfig})
