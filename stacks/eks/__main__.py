"""EKS stack: GpuEksCluster, then the GPU layer (infra/stack.py) and GpuKarpenter on it.

Config: stacks/README.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pulumi

from infra import stack_config
from infra.efa import efa_device_plugin
from infra.eks import (
    ExistingVpcArgs,
    GpuEksCluster,
    GpuEksClusterArgs,
    GpuNodeGroupArgs,
    NodeGroupArgs,
)
from infra.gpu_sharing import GpuSharingArgs, instance_family, require_mig_capable
from infra.karpenter import GpuKarpenter, GpuKarpenterArgs, GpuNodePoolArgs
from infra.stack import check_settings, deploy_gpu_layer, export_access, gpu_sharing_args
from infra.store.rds import eks_rds_network
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
    "capacityReservationIds": "list",
    "gpuLimit": "int",
    "consolidateAfter": "str",
    "amiAlias": "str",
    "diskSizeGib": "int",
    "expireAfter": "str",
    "terminationGracePeriod": "str",
    "efa": "bool",
    "availabilityZone": "str",
    "instanceStoreRaid0": "bool",
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
    "capacityReservationId": "str",
    "availabilityZone": "str",
    "subnetIds": "list",
    "efa": "bool",
    "instanceStoreRaid0": "bool",
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
        capacity_reservation_id=spec.get("capacityReservationId"),
        availability_zone=spec.get("availabilityZone"),
        subnet_ids=spec.get("subnetIds", ()),
        efa=spec.get("efa", False),
        instance_store_raid0=spec.get("instanceStoreRaid0", False),
        device_plugin_config=pool_config(
            sharing,
            spec.get("devicePluginConfig"),
            tuple(instance_family(t) for t in instance_types),
            f"{key}.devicePluginConfig",
        ),
    )


def aws_region(why: str) -> str:
    """The region, where the AWS provider finds it too; ConfigError saying ``why`` without one."""
    region = (
        pulumi.Config("aws").get("region")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    if not region:
        raise stack_config.ConfigError(f"stack config aws:region (or AWS_REGION) is needed: {why}")
    return region


def karpenter_args(
    config: pulumi.Config, cluster_name: str, sharing: GpuSharingArgs
) -> GpuKarpenterArgs | None:
    """``karpenter`` from stack config: on unless ``enabled: false``."""
    spec = stack_config.fields(
        "karpenter", stack_config.read_object(config, "karpenter") or {}, KARPENTER_FIELDS
    )
    if not spec.get("enabled", True):
        return None
    region = aws_region("Karpenter's IAM policy names it")
    if "gpuLimit" not in spec:
        raise stack_config.ConfigError(
            "stack config karpenter.gpuLimit is needed: the most nvidia.com/gpu Karpenter may "
            "launch (8 per p5.48xlarge, 1 per g5.xlarge), or karpenter.enabled: false"
        )
    defaults = GpuNodePoolArgs(gpu_limit=1)
    try:
        pool = GpuNodePoolArgs(
            gpu_limit=spec["gpuLimit"],
            instance_families=spec.get("instanceFamilies", defaults.instance_families),
            capacity_types=spec.get("capacityTypes", defaults.capacity_types),
            capacity_reservation_ids=spec.get("capacityReservationIds", ()),
            consolidate_after=spec.get("consolidateAfter", defaults.consolidate_after),
            ami_alias=spec.get("amiAlias", defaults.ami_alias),
            disk_size_gib=spec.get("diskSizeGib", defaults.disk_size_gib),
            expire_after=spec.get("expireAfter", defaults.expire_after),
            termination_grace_period=spec.get("terminationGracePeriod"),
            efa=spec.get("efa", False),
            availability_zone=spec.get("availabilityZone"),
            instance_store_raid0=spec.get("instanceStoreRaid0", False),
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


def existing_private_subnets(config: pulumi.Config) -> tuple[str, ...]:
    """``existingPrivateSubnetIds``, which ``existingVpcId`` needs (its nodes go there)."""
    subnets = stack_config.read_object(config, "existingPrivateSubnetIds")
    if not subnets:
        raise stack_config.ConfigError(
            "stack config existingPrivateSubnetIds is needed with existingVpcId: the nodes' subnets"
        )
    return stack_config.strings("existingPrivateSubnetIds", subnets)


def cluster_args(
    config: pulumi.Config, cluster_name: str, karpenter: bool, sharing: GpuSharingArgs
) -> GpuEksClusterArgs:
    existing_vpc_id = stack_config.optional_text(config, "existingVpcId")
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
        gpu_groups = tuple(
            gpu_node_group(f"gpuNodeGroups[{index}]", spec, sharing)
            for index, spec in enumerate(groups)
        )
        return GpuEksClusterArgs(
            cluster_name=cluster_name,
            kubernetes_version=config.get("kubernetesVersion") or KUBERNETES_VERSION,
            gpu_node_groups=gpu_groups,
            vpc=VpcArgs(
                cidr_block=config.get("vpcCidr") or "10.0.0.0/16",
                availability_zones=tuple(config.get_object("availabilityZones") or ()),
            ),
            existing_vpc=(
                ExistingVpcArgs(
                    vpc_id=existing_vpc_id,
                    private_subnet_ids=existing_private_subnets(config),
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


def uses_efa(cluster: GpuEksClusterArgs, karpenter: GpuKarpenterArgs | None) -> bool:
    """Whether a GPU node group or Karpenter pool has EFA (the EFA device plugin is needed)."""
    pools = karpenter.node_pools if karpenter is not None else ()
    return any(group.efa for group in cluster.gpu_node_groups) or any(p.efa for p in pools)


check_settings(Path(__file__).resolve().parent)
config = pulumi.Config()
# One name for both: Karpenter's IAM policy and node class select the cluster's resources by it.
cluster_name = config.get("clusterName") or "gpu-cluster"
# Device plugin configurations (MIG strategy, sharing) that the GPU node pools pick by label.
sharing = gpu_sharing_args(config)
karpenter = karpenter_args(config, cluster_name, sharing)
cluster_config = cluster_args(config, cluster_name, karpenter is not None, sharing)
cluster = GpuEksCluster("gpu-eks", cluster_config)
layer = deploy_gpu_layer(
    config,
    cluster.kubeconfig,
    depends_on=cluster.ready,
    storage_class=cluster.storage_class,
    platform_name="eks",
    rds_network=lambda: eks_rds_network(
        cluster, aws_region("the RDS store's CA bundle is per region")
    ),
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
if uses_efa(cluster_config, karpenter):
    efa_device_plugin(layer.provider, depends_on=[layer.platform])
export_access(cluster.cluster_name, cluster.kubeconfig, layer)
