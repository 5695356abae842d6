"""EKS stack: GpuEksCluster, then GpuPlatform and GpuProfiler on it. Config: stacks/README.md."""

from __future__ import annotations

from typing import Any

import pulumi

from infra import stack_config
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

SYSTEM_GROUP_FIELDS = {
    "instanceTypes": "list",
    "minSize": "int",
    "maxSize": "int",
    "desiredSize": "int",
}
GPU_GROUP_FIELDS = {
    "name": "str",
    "instanceTypes": "list",
    "amiType": "str",
    "minSize": "int",
    "maxSize": "int",
    "desiredSize": "int",
    "diskSizeGib": "int",
    "capacityType": "str",
}


def gpu_node_group(key: str, value: Any) -> GpuNodeGroupArgs:
    spec = stack_config.fields(key, value, GPU_GROUP_FIELDS)
    return GpuNodeGroupArgs(
        name=spec.get("name", "gpu"),
        instance_types=spec.get("instanceTypes", ("g5.xlarge",)),
        ami_type=spec.get("amiType", "AL2023_x86_64_NVIDIA"),
        min_size=spec.get("minSize", 0),
        max_size=spec.get("maxSize", 2),
        desired_size=spec.get("desiredSize", 1),
        disk_size_gib=spec.get("diskSizeGib", 200),
        capacity_type=spec.get("capacityType", "ON_DEMAND"),
    )


def cluster_args(config: pulumi.Config) -> GpuEksClusterArgs:
    existing_vpc_id = config.get("existingVpcId")
    system = stack_config.fields(
        "systemNodeGroup",
        stack_config.read_object(config, "systemNodeGroup") or {},
        SYSTEM_GROUP_FIELDS,
    )
    groups = stack_config.read_object(config, "gpuNodeGroups") or [{}]
    if not isinstance(groups, list):
        raise stack_config.ConfigError("stack config gpuNodeGroups must be a list of node groups")
    cidrs = stack_config.read_object(config, "publicAccessCidrs")
    try:
        return GpuEksClusterArgs(
            cluster_name=config.get("clusterName") or "gpu-cluster",
            kubernetes_version=config.get("kubernetesVersion") or KUBERNETES_VERSION,
            gpu_node_groups=tuple(
                gpu_node_group(f"gpuNodeGroups[{index}]", spec) for index, spec in enumerate(groups)
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
                instance_types=system.get("instanceTypes", ("m6i.large",)),
                min_size=system.get("minSize", 1),
                max_size=system.get("maxSize", 3),
                desired_size=system.get("desiredSize", 2),
            ),
            public_access_cidrs=(
                stack_config.public_access_cidrs(cidrs) if cidrs is not None else ("0.0.0.0/0",)
            ),
        )
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config: {error}") from None


config = pulumi.Config()
cluster = GpuEksCluster("gpu-eks", cluster_args(config))
layer = deploy_gpu_layer(
    config, cluster.kubeconfig, depends_on=cluster.ready, storage_class=cluster.storage_class
)
export_access(cluster.cluster_name, cluster.kubeconfig, layer)
