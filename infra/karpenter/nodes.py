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

from infra.eks import EFA_NODE_LABEL, GPU_NODE_IMDS_HOP_LIMIT, gpu_node_user_data
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
# "reserved": on-demand capacity reservations and Capacity Blocks that the node class selects.
CAPACITY_TYPES = ("on-demand", "spot", "reserved")
CAPACITY_RESERVATION_ID = re.compile(r"^cr-[0-9a-z]+$")
ZONE_LABEL = "topology.kubernetes.io/zone"
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

    # nvidia.com/gpu across the pool's nodes: what the pool may cost at most. No default: one
    # p5.48xlarge alone has 8, a g5.xlarge 1 (the EKS stack's karpenter.gpuLimit).
    gpu_limit: int
    name: str = "gpu"
    # EC2 instance families (karpenter.k8s.aws/instance-family) of NVIDIA GPUs: g5, g6, g6e,
    # p4d, p5, p5e, p5en ... (p5 and p5e usually come as capacity reservations or Capacity Blocks).
    instance_families: tuple[str, ...] = ("g5", "g6", "g6e")
    capacity_types: tuple[str, ...] = ("on-demand",)
    architectures: tuple[str, ...] = ("amd64",)
    # Capacity reservations (cr-...) and Capacity Blocks the pool may use, with capacity type
    # "reserved"; Karpenter prefers them over on-demand while they have room.
    capacity_reservation_ids: tuple[str, ...] = ()
    # EFA: instances in one zone (``availability_zone``), in the pool's cluster placement group,
    # with the EFA interfaces their pods request (vpc.amazonaws.com/efa).
    efa: bool = False
    availability_zone: str | None = None
    # Instance-store NVMe disks (p4d, p5) as one RAID0 array for the kubelet's and containerd's
    # storage; off: the disks stay unused.
    instance_store_raid0: bool = False
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
        self._check_reservations()
        if self.efa and not self.availability_zone:
            raise ValueError(
                "efa needs availabilityZone: a cluster placement group lies in one zone "
                "(the zone of your capacity reservation, if any)"
            )
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

    def _check_reservations(self) -> None:
        wrong = [i for i in self.capacity_reservation_ids if not CAPACITY_RESERVATION_ID.match(i)]
        if wrong:
            raise ValueError(f"capacityReservationIds must be cr-... ids, got {wrong}")
        reserved = "reserved" in self.capacity_types
        if reserved != bool(self.capacity_reservation_ids):
            raise ValueError(
                "capacityTypes reserved and capacityReservationIds go together: reserved "
                "capacity is the reservations (and Capacity Blocks) the pool may use"
            )


def placement_group_name(cluster_name: str, pool: GpuNodePoolArgs) -> str:
    """The cluster placement group of an EFA pool (GpuKarpenter creates it)."""
    return f"{cluster_name}-{pool.name}-efa"


def karpenter_values(cluster_name: str, queue_name: str, role_arn: str) -> dict[str, Any]:
    """Values of the karpenter chart (installed without its crds/: karpenter-crd holds them).

    Node repair replaces nodes whose conditions (the EKS node monitoring agent's, the kubelet's)
    stay unhealthy, GPU faults among them; reserved capacity is the chart's default, spelt out.
    """
    return {
        "settings": {
            "clusterName": cluster_name,
            "interruptionQueue": queue_name,
            "featureGates": {"nodeRepair": True, "reservedCapacity": True},
        },
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
            "httpPutResponseHopLimit": GPU_NODE_IMDS_HOP_LIMIT,  # as the node groups' (eks.py)
        },
        # GPUs only through the device plugin, as on the managed GPU node groups.
        "userData": gpu_node_user_data(),
        "tags": {"gpu-cluster/node-pool": pool.name},
        **(
            {"capacityReservationSelectorTerms": [{"id": i} for i in pool.capacity_reservation_ids]}
            if pool.capacity_reservation_ids
            else {}
        ),
        **(
            {"placementGroupSelector": {"name": placement_group_name(cluster_name, pool)}}
            if pool.efa
            else {}
        ),
        **({"instanceStorePolicy": "RAID0"} if pool.instance_store_raid0 else {}),
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
    if pool.efa and pool.availability_zone:
        # A cluster placement group holds instances of one zone only.
        requirements.append((ZONE_LABEL, (pool.availability_zone,)))
        labels[EFA_NODE_LABEL] = "true"
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
