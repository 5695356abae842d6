"""EKS stack: GpuEksCluster, then the GPU layer (infra/stack.py) and GpuKarpenter on it.

Config: stacks/README.md.
"""

from __future__ import annotations

import os
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
from infra.gpu_sharing import GpuSharingArgs, instance_family, require_mig_capable
from infra.karpenter import GpuKarpenter, GpuKarpenterArgs, GpuNodePoolArgs
from infra.stack import deploy_gpu_layer, export_access, gpu_sharing_args
from infra.versions import KUBERNETES_VERSION
from infra.vpc import VpcArgs

SYSTEM_GROUP_FIELDS = {
    "instanceTypes": "list",
    "minSize": "int",
    "maxSize": "int",
    "desiredSize": "int",
}
KARPENTER_FIELDS = {
    "enabled": "bool",
    "instanceFamilies": "list",
    "capacityTypes": "list",
    "gpuLimit": "int",
    "consolidateAfter": "str",
    "amiAlias": "str",
    "diskSizeGib": "int",
    "devicePluginConfig": "str",
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
    "devicePluginConfig": "str",
}


def pool_config(
    sharing: GpuSharingArgs, name: str | None, families: tuple[str, ...], where: str
) -> str | None:
    """A node pool's ``devicePluginConfig``, checked against ``gpuSharing`` and its GPUs."""
    if name is None:
        return None
    try:
        require_mig_capable(sharing.config(name, where), families, where)
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config {error}") from None
    return name


def gpu_node_group(key: str, value: Any, sharing: GpuSharingArgs) -> GpuNodeGroupArgs:
    spec = stack_config.fields(key, value, GPU_GROUP_FIELDS)
    instance_types = spec.get("instanceTypes", ("g5.xlarge",))
    return GpuNodeGroupArgs(
        name=spec.get("name", "gpu"),
        instance_types=instance_types,
        ami_type=spec.get("amiType", "AL2023_x86_64_NVIDIA"),
        min_size=spec.get("minSize", 0),
        max_size=spec.get("maxSize", 2),
        desired_size=spec.get("desiredSize", 1),
        disk_size_gib=spec.get("diskSizeGib", 200),
        capacity_type=spec.get("capacityType", "ON_DEMAND"),
        device_plugin_config=pool_config(
            sharing,
            spec.get("devicePluginConfig"),
            tuple(instance_family(t) for t in instance_types),
            f"{key}.devicePluginConfig",
        ),
    )


def karpenter_args(
    config: pulumi.Config, cluster_name: str, sharing: GpuSharingArgs
) -> GpuKarpenterArgs | None:
    """``karpenter`` from stack config: on unless ``enabled: false``."""
    spec = stack_config.fields(
        "karpenter", stack_config.read_object(config, "karpenter") or {}, KARPENTER_FIELDS
    )
    if not spec.get("enabled", True):
        return None
    # Where the AWS provider finds it too.
    region = (
        pulumi.Config("aws").get("region")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    if not region:
        raise stack_config.ConfigError(
            "stack config aws:region (or AWS_REGION) is needed: Karpenter's IAM policy names it"
        )
    defaults = GpuNodePoolArgs()
    try:
        pool = GpuNodePoolArgs(
            instance_families=spec.get("instanceFamilies", defaults.instance_families),
            capacity_types=spec.get("capacityTypes", defaults.capacity_types),
            gpu_limit=spec.get("gpuLimit", defaults.gpu_limit),
            consolidate_after=spec.get("consolidateAfter", defaults.consolidate_after),
            ami_alias=spec.get("amiAlias", defaults.ami_alias),
            disk_size_gib=spec.get("diskSizeGib", defaults.disk_size_gib),
            device_plugin_config=pool_config(
                sharing,
                spec.get("devicePluginConfig"),
                spec.get("instanceFamilies", defaults.instance_families),
                "karpenter.devicePluginConfig",
            ),
        )
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config karpenter: {error}") from None
    return GpuKarpenterArgs(cluster_name=cluster_name, region=region, node_pools=(pool,))


def cluster_args(
    config: pulumi.Config, cluster_name: str, karpenter: bool, sharing: GpuSharingArgs
) -> GpuEksClusterArgs:
    existing_vpc_id = config.get("existingVpcId")
    system = stack_config.fields(
        "systemNodeGroup",
        stack_config.read_object(config, "systemNodeGroup") or {},
        SYSTEM_GROUP_FIELDS,
    )
    groups = stack_config.read_object(config, "gpuNodeGroups")
    if groups is None:
        groups = [{}]
    if not isinstance(groups, list):
        raise stack_config.ConfigError("stack config gpuNodeGroups must be a list of node groups")
    cidrs = stack_config.read_object(config, "publicAccessCidrs")
    try:
        return GpuEksClusterArgs(
            cluster_name=cluster_name,
            kubernetes_version=config.get("kubernetesVersion") or KUBERNETES_VERSION,
            gpu_node_groups=tuple(
                gpu_node_group(f"gpuNodeGroups[{index}]", spec, sharing)
                for index, spec in enumerate(groups)
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
            gpu_nodes_from_karpenter=karpenter,
        )
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config: {error}") from None


config = pulumi.Config()
# One name for both: Karpenter's IAM policy and node class select the cluster's resources by it.
cluster_name = config.get("clusterName") or "gpu-cluster"
# Device plugin configurations (MIG strategy, sharing) that the GPU node pools pick by label.
sharing = gpu_sharing_args(config)
karpenter = karpenter_args(config, cluster_name, sharing)
cluster = GpuEksCluster(
    "gpu-eks", cluster_args(config, cluster_name, karpenter is not None, sharing)
)
layer = deploy_gpu_layer(
    config,
    cluster.kubeconfig,
    depends_on=cluster.ready,
    storage_class=cluster.storage_class,
    gpu_sharing=sharing,
)
if karpenter is not None:
    # After the platform: the chart's ServiceMonitor needs the Prometheus operator's CRDs.
    GpuKarpenter(
        "karpenter",
        karpenter,
        cluster,
        opts=pulumi.ResourceOptions(providers=[layer.provider], depends_on=[layer.platform]),
    )
export_access(cluster.cluster_name, cluster.kubeconfig, layer)
