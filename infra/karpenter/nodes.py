"""Karpenter's Kubernetes side: chart values, the GPU EC2NodeClass and the GPU NodePool.

GPU nodes Karpenter launches look like the managed GPU node groups' (infra/eks.py): the label
``nvidia.com/gpu.present=true`` and the taint ``nvidia.com/gpu=present:NoSchedule`` that the device
plugin, dcgm-exporter and the profiler select and tolerate, an NVIDIA Amazon Linux 2023 AMI, and
the same user data for the NVIDIA container toolkit. A node counts as initialised only once the
device plugin has registered ``nvidia.com/gpu`` on it, so the plugin must reach these nodes (the
render check ``scheduling`` proves it does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from infra.eks import gpu_node_user_data
from infra.gpu import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
)
from infra.gpu_sharing import CONFIG_LABEL

NODE_CLASS_GROUP = "karpenter.k8s.aws"
NODE_CLASS_API = f"{NODE_CLASS_GROUP}/v1"
NODE_POOL_API = "karpenter.sh/v1"
CAPACITY_TYPES = ("on-demand", "spot")
# Karpenter's duration format (Go's, in whole units) or "Never".
DURATION = re.compile(r"^(\d+(s|m|h))+$|^Never$")
# Nodes are replaced after this long, so they pick up new AMIs; training jobs Karpenter must not
# disrupt are protected by the profiler's karpenter.sh/do-not-disrupt annotation.
EXPIRE_AFTER = "720h"


@dataclass(frozen=True)
class GpuNodePoolArgs:
    """A Karpenter NodePool of NVIDIA GPU instances and its EC2NodeClass."""

    name: str = "gpu"
    # EC2 instance families (karpenter.k8s.aws/instance-family), NVIDIA GPUs only.
    instance_families: tuple[str, ...] = ("g5", "g6", "g6e")
    capacity_types: tuple[str, ...] = ("on-demand",)
    architectures: tuple[str, ...] = ("amd64",)
    gpu_limit: int = 8  # nvidia.com/gpu across the pool's nodes
    # Empty or underused nodes go away this long after they became so.
    consolidate_after: str = "10m"
    # Amazon Linux 2023 through Karpenter's alias: it picks the NVIDIA variant for GPU instances.
    # Pin a version (al2023@v20251117) for reproducible nodes; `latest` follows AWS' releases.
    ami_alias: str = "al2023@latest"
    disk_size_gib: int = 200  # CUDA images are large
    # The device plugin configuration its nodes use (infra/gpu_sharing.py); None: the default.
    device_plugin_config: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.capacity_types) - set(CAPACITY_TYPES))
        if not self.capacity_types or unknown:
            raise ValueError(
                f"capacityTypes must be some of {', '.join(CAPACITY_TYPES)}, got "
                f"{list(self.capacity_types)}"
            )
        if self.gpu_limit < 1:
            raise ValueError(f"gpuLimit must be at least 1, got {self.gpu_limit}")
        if not DURATION.match(self.consolidate_after):
            raise ValueError(
                f"consolidateAfter must be a duration such as 30s, 10m or 1h (or Never), got "
                f"{self.consolidate_after!r}"
            )
        if not self.ami_alias.startswith("al2023@"):
            raise ValueError(
                f"amiAlias must be an Amazon Linux 2023 alias (al2023@latest or "
                f"al2023@v<date>): its NVIDIA variant carries the driver; got {self.ami_alias!r}"
            )


def karpenter_values(cluster_name: str, queue_name: str, role_arn: str) -> dict[str, Any]:
    """Values of the karpenter chart (installed without its crds/: karpenter-crd holds them)."""
    return {
        "settings": {"clusterName": cluster_name, "interruptionQueue": queue_name},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": role_arn}},
        "serviceMonitor": {"enabled": True},
        "controller": {
            "resources": {
                "requests": {"cpu": "250m", "memory": "512Mi"},
                "limits": {"memory": "1Gi"},
            }
        },
    }


def ec2_node_class_spec(
    pool: GpuNodePoolArgs, cluster_name: str, node_role_name: str, subnet_ids: list[str]
) -> dict[str, Any]:
    """Where and how GPU instances start: private subnets, the cluster's security group."""
    return {
        "role": node_role_name,
        "amiSelectorTerms": [{"alias": pool.ami_alias}],
        "subnetSelectorTerms": [{"id": subnet} for subnet in subnet_ids],
        # The security group EKS creates for the cluster (the managed node groups' too).
        "securityGroupSelectorTerms": [{"tags": {"aws:eks:cluster-name": cluster_name}}],
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvda",
                "ebs": {
                    "volumeSize": f"{pool.disk_size_gib}Gi",
                    "volumeType": "gp3",
                    "encrypted": True,
                    "deleteOnTermination": True,
                },
            }
        ],
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            "httpPutResponseHopLimit": 2,
        },
        # GPUs only through the device plugin, as on the managed GPU node groups.
        "userData": gpu_node_user_data(),
        "tags": {"gpu-cluster/node-pool": pool.name},
    }


def node_pool_spec(pool: GpuNodePoolArgs) -> dict[str, Any]:
    """NVIDIA GPU instances, labelled and tainted as GPU nodes, limited and consolidated."""
    requirements = [
        ("karpenter.k8s.aws/instance-family", pool.instance_families),
        ("karpenter.k8s.aws/instance-gpu-manufacturer", ("nvidia",)),
        ("karpenter.sh/capacity-type", pool.capacity_types),
        ("kubernetes.io/arch", pool.architectures),
        ("kubernetes.io/os", ("linux",)),
    ]
    labels = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE}
    if pool.device_plugin_config is not None:
        labels[CONFIG_LABEL] = pool.device_plugin_config
    return {
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "nodeClassRef": {
                    "group": NODE_CLASS_GROUP,
                    "kind": "EC2NodeClass",
                    "name": pool.name,
                },
                "taints": [
                    {"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}
                ],
                "requirements": [
                    {"key": key, "operator": "In", "values": list(values)}
                    for key, values in requirements
                ],
                "expireAfter": EXPIRE_AFTER,
            },
        },
        "limits": {GPU_RESOURCE: str(pool.gpu_limit)},
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": pool.consolidate_after,
        },
    }
