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

NODE_CLASS_GROUP = "karpenter.k8s.aws"
NODE_CLASS_API = f"{NODE_CLASS_GROUP}/v1"
NODE_POOL_API = "karpenter.sh/v1"
CAPACITY_TYPES = ("on-demand", "spot")
# Karpenter's duration format (Go's, in whole units), and "Never" where a field takes it.
DURATION = re.compile(r"^(\d+(s|m|h))+$|^Never$")
GRACE_PERIOD = re.compile(r"^(\d+(s|m|h))+$")
# Expiration is forceful (Karpenter's disruption.md): an expired node is drained whatever its
# pods' karpenter.sh/do-not-disrupt says, and a pod that annotation protects then blocks the
# drain until terminationGracePeriod, if any, deletes it: without one, the node stays half
# drained (tainted, its other pods evicted) for as long as the protected pod runs. So nodes do
# not expire by default: drift (a new AMI from the al2023@latest alias, a changed NodePool or
# EC2NodeClass) replaces them, gracefully, once nothing protected runs there. A stack that wants
# a maximum node lifetime sets expireAfter with a terminationGracePeriod, and accepts that a
# training job still running at expireAfter + terminationGracePeriod is killed.
EXPIRE_AFTER = "Never"


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
    # Node lifetime (a duration or Never), and how long an expired or drifted node may take to
    # drain before Karpenter deletes the pods blocking it, do-not-disrupt included (None: as
    # long as they run). expireAfter needs a terminationGracePeriod (see EXPIRE_AFTER).
    expire_after: str = EXPIRE_AFTER
    termination_grace_period: str | None = None

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
        if not DURATION.match(self.expire_after):
            raise ValueError(
                f"expireAfter must be a duration such as 720h (or Never), got {self.expire_after!r}"
            )
        grace = self.termination_grace_period
        if grace is not None and not GRACE_PERIOD.match(grace):
            raise ValueError(
                f"terminationGracePeriod must be a duration such as 48h, got {grace!r}"
            )
        if self.expire_after != "Never" and grace is None:
            raise ValueError(
                f"expireAfter {self.expire_after} needs a terminationGracePeriod: an expired "
                "node whose pod carries karpenter.sh/do-not-disrupt (the profiler's training "
                "protection) would otherwise stay half drained for as long as that pod runs"
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
    return {
        "template": {
            "metadata": {"labels": {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE}},
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
                "expireAfter": pool.expire_after,
                **(
                    {"terminationGracePeriod": pool.termination_grace_period}
                    if pool.termination_grace_period
                    else {}
                ),
            },
        },
        "limits": {GPU_RESOURCE: str(pool.gpu_limit)},
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": pool.consolidate_after,
        },
    }
