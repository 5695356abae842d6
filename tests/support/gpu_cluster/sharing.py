"""MIG devices and time-sliced GPUs in the stand-in GPU cluster (a TEST DOUBLE of what NVIDIA's
device plugin and GPU feature discovery do on such nodes).

It follows NVIDIA/k8s-device-plugin at v0.20.0 (the chart infra/versions.py pins): the resources
offered, api/config/v1/replicas.go (``renameByDefault`` offers the replicas as
``<resource>.shared``); GFD's labels, internal/lm/resource.go and internal/lm/mig-strategy.go.

- A node whose ``GpuNode.mig`` lists MIG devices runs the device plugin with migStrategy mixed:
  each profile is a resource of its own, ``nvidia.com/mig-<profile>``, one device per MIG
  instance; GPUs without MIG devices stay ``nvidia.com/gpu``. GFD labels the node
  ``nvidia.com/mig.strategy=mixed`` and, per profile, ``nvidia.com/mig-<profile>.count``,
  ``.product`` (``<model>-MIG-<profile>``), ``.replicas`` and ``.sharing-strategy``
  (``NewMIGResourceLabeler``). In a container given one MIG device, ``nvidia-smi -L`` lists its
  GPU and, under it, that device.
- A node with ``GpuNode.time_slicing_replicas`` R runs a time-slicing config with renameByDefault:
  each GPU is offered R times as ``nvidia.com/gpu.shared``; GFD labels it
  ``nvidia.com/gpu.sharing-strategy=time-slicing`` and ``nvidia.com/gpu.replicas=R``. The product
  keeps its plain name: GFD appends ``-SHARED`` only to a shared resource that is *not* renamed
  (``getProductName``: ``if rl.isShared() && !rl.isRenamed()``).

Breakages (``Scenario``): ``mig_devices_leak``: a container given one MIG device sees every MIG
device of its GPU; ``sharing_not_applied``: GFD's labels say time-slicing, but the device plugin
offers each GPU once (its configuration never reached it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.gpu import GPU_RESOURCE
from tests.support.gpu_cluster.scenario import GpuNode, Scenario

Json = dict[str, Any]
MIG_PREFIX = "nvidia.com/mig-"
SHARED_RESOURCE = f"{GPU_RESOURCE}.shared"


@dataclass(frozen=True)
class Device:
    """One device of a sharing resource: a MIG device, or a replica of a time-sliced GPU."""

    resource: str
    gpu: int
    profile: str | None = None  # the MIG device's profile
    instance: int | None = None  # the MIG device's index on its GPU
    replica: int | None = None


def shares(node: GpuNode) -> bool:
    return any(node.mig) or node.time_slicing_replicas > 0


def devices(node: GpuNode, scenario: Scenario) -> list[Device]:
    """Every device of the node's sharing resources, in the device plugin's order."""
    found = [
        Device(f"{MIG_PREFIX}{profile}", gpu, profile=profile, instance=instance)
        for gpu, profiles in enumerate(node.mig)
        for instance, profile in enumerate(profiles)
    ]
    replicas = 1 if scenario.sharing_not_applied else node.time_slicing_replicas
    if node.time_slicing_replicas:
        found += [
            Device(SHARED_RESOURCE, gpu, replica=replica)
            for gpu in range(node.gpus)
            for replica in range(replicas)
        ]
    return found


def whole_gpus(node: GpuNode) -> list[int]:
    """The GPUs offered whole, as nvidia.com/gpu: those without MIG devices, none when shared."""
    if node.time_slicing_replicas:
        return []
    with_mig = {gpu for gpu, profiles in enumerate(node.mig) if profiles}
    return [gpu for gpu in range(node.gpus - node.unhealthy_gpus) if gpu not in with_mig]


def resources(node: GpuNode, scenario: Scenario) -> dict[str, str]:
    """What the device plugin registers on the node (capacity and allocatable alike)."""
    counts: dict[str, int] = {}
    for device in devices(node, scenario):
        counts[device.resource] = counts.get(device.resource, 0) + 1
    if not node.time_slicing_replicas:
        counts[GPU_RESOURCE] = len(whole_gpus(node))
    return {resource: str(count) for resource, count in counts.items()}


def gfd_labels(node: GpuNode) -> dict[str, str]:
    """GPU feature discovery's sharing and MIG labels (those of the config it read), over the
    whole-GPU labels of controllers.gfd_labels."""
    labels: dict[str, str] = {}
    product = node.model.replace(" ", "-")
    if any(node.mig):
        labels["nvidia.com/mig.strategy"] = "mixed"
        for profile in sorted({p for profiles in node.mig for p in profiles}):
            resource = f"{MIG_PREFIX}{profile}"
            count = sum(profiles.count(profile) for profiles in node.mig)
            labels |= {
                f"{resource}.count": str(count),
                f"{resource}.product": f"{product}-MIG-{profile}",
                f"{resource}.replicas": "1",
                f"{resource}.sharing-strategy": "none",
            }
        if all(node.mig[gpu] if gpu < len(node.mig) else () for gpu in range(node.gpus)):
            # Only MIG-enabled GPUs: their labeler has no sharing config (replicas 0).
            labels["nvidia.com/gpu.replicas"] = "0"
    if node.time_slicing_replicas:
        labels |= {
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/gpu.replicas": str(node.time_slicing_replicas),
        }
    return labels


def requested(pod_spec: Json) -> dict[str, int]:
    """The sharing resources (MIG devices, shared GPUs) the pod's containers ask for."""
    wanted: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        for resource, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if resource.startswith(MIG_PREFIX) or resource == SHARED_RESOURCE:
                wanted[resource] = wanted.get(resource, 0) + int(value)
    return wanted


def free_counts(free: list[Device]) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for device in free:
        counts[device.resource] = counts.get(device.resource, 0) + 1
    return counts


def allocate(free: list[Device], wanted: Mapping[str, int]) -> list[Device]:
    """The first free devices of each wanted resource (the caller checked there are enough)."""
    chosen: list[Device] = []
    for resource, count in wanted.items():
        chosen += [device for device in free if device.resource == resource][:count]
    return chosen


def mig_uuid(node: GpuNode, device: Device) -> str:
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node.name}/{device.gpu}/{device.instance}')}"


def nvidia_smi_listing(
    node: GpuNode, given: list[Device], scenario: Scenario, gpu_uuid: Any
) -> str:
    """``nvidia-smi -L`` in a container given ``given``: each GPU once, its MIG devices under it
    (all of the GPU's with ``mig_devices_leak``). ``gpu_uuid(index)`` names a GPU."""
    lines = []
    for position, gpu in enumerate(sorted({device.gpu for device in given})):
        lines.append(f"GPU {position}: {node.model} (UUID: {gpu_uuid(gpu)})")
        shown = [d for d in given if d.gpu == gpu and d.profile is not None]
        if shown and scenario.mig_devices_leak:
            shown = [d for d in devices(node, scenario) if d.gpu == gpu and d.profile is not None]
        for index, device in enumerate(shown):
            lines.append(
                f"  MIG {device.profile:<13} Device {index:2}: (UUID: {mig_uuid(node, device)})"
            )
    return "".join(f"{line}\n" for line in lines)
