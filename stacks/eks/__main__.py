"""EKS stack: GpuEksCluster, then GpuPlatform and GpuProfiler on it. Config: stacks/README.md."""

from __future__ import annotations

from typing import Any

import pulumi

from infra.eks import (
    ExistingVpcArgs,
    GpuEksCluster,
    GpuEksClusterArgs,
    GpuNodeGroupArgs,
    NodeGroupArgs,
)
from infra.stack import deploy_gpu_layer, export_access
from infra.versions import KUBERNETES_VERSION
from infra.vpc import VpcArgs


def gpu_node_group(spec: dict[str, Any]) -> GpuNodeGroupArgs:
    return GpuNodeGroupArgs(
        name=spec.get("name", "gpu"),
        instance_types=tuple(spec.get("instanceTypes", ["g5.xlarge"])),
        ami_type=spec.get("amiType", "AL2023_x86_64_NVIDIA"),
        min_size=int(spec.get("minSize", 0)),
        max_size=int(spec.get("maxSize", 2)),
        desired_size=int(spec.get("desiredSize", 1)),
        disk_size_gib=int(spec.get("diskSizeGib", 200)),
        capacity_type=spec.get("capacityType", "ON_DEMAND"),
    )


def cluster_args(config: pulumi.Config) -> GpuEksClusterArgs:
    existing_vpc_id = config.get("existingVpcId")
    system: dict[str, Any] = config.get_object("systemNodeGroup") or {}
    return GpuEksClusterArgs(
        cluster_name=config.get("clusterName") or "gpu-cluster",
        kubernetes_version=config.get("kubernetesVersion") or KUBERNETES_VERSION,
        gpu_node_groups=tuple(
            gpu_node_group(spec) for spec in (config.get_object("gpuNodeGroups") or [{}])
        ),
        vpc=VpcArgs(
            cidr_block=config.get("vpcCidr") or "10.0.0.0/16",
            availability_zones=tuple(config.get_object("availabilityZones") or ()),
        ),
        existing_vpc=(
            ExistingVpcArgs(
                vpc_id=existing_vpc_id,
                private_subnet_ids=tuple(config.require_object("existingPrivateSubnetIds")),
                public_subnet_ids=tuple(config.get_object("existingPublicSubnetIds") or ()),
            )
            if existing_vpc_id
            else None
        ),
        system_node_group=NodeGroupArgs(
            instance_types=tuple(system.get("instanceTypes", ["m6i.large"])),
            min_size=int(system.get("minSize", 1)),
            max_size=int(system.get("maxSize", 3)),
            desired_size=int(system.get("desiredSize", 2)),
        ),
        public_access_cidrs=tuple(config.get_object("publicAccessCidrs") or ("0.0.0.0/0",)),
    )


config = pulumi.Config()
cluster = GpuEksCluster("gpu-eks", cluster_args(config))
layer = deploy_gpu_layer(config, cluster.kubeconfig, depends_on=[*cluster.gpu_node_groups])
export_access(cluster.cluster_name, cluster.kubeconfig, layer)
