"""How GPU nodes present their GPUs: MIG strategy and sharing, per node pool.

NVIDIA's device plugin reads named configurations from a ConfigMap (the chart's ``config.map``)
and applies, on each node, the one its ``nvidia.com/device-plugin.config`` label names (the
chart's ``config.default`` where there is no label); GPU feature discovery reads the same one and
labels the node with the result (``nvidia.com/gpu.sharing-strategy``, ``nvidia.com/gpu.replicas``,
``nvidia.com/mig.strategy``). A node pool picks its configuration through that label: EKS GPU
node groups and Karpenter's NodePool carry it in their node labels, kubeadm nodes get it from a
label patch.

- ``migStrategy`` ``none``: whole GPUs as ``nvidia.com/gpu`` (MIG devices are not offered);
  ``single``: every GPU of the node is split alike and its MIG devices are ``nvidia.com/gpu``;
  ``mixed``: each MIG profile is a resource of its own, ``nvidia.com/mig-<profile>``.
- ``sharing: time-slicing``: each GPU is offered ``replicas`` times; the replicas share the GPU by
  time, with no memory or fault isolation. ``renameByDefault`` (on by default here) offers them
  as ``nvidia.com/gpu.shared``, so a pod asking for ``nvidia.com/gpu`` never lands on a shared
  GPU without saying so; ``failRequestsGreaterThanOne`` (on) refuses a pod asking for two
  replicas, which would buy it no more of the GPU.
- ``sharing: mps`` (experimental): the replicas share the GPU through a CUDA MPS control daemon
  that the chart runs on the node, each limited to ``1/replicas`` of the memory and the SMs.
  The device plugin offers MPS on whole GPUs only, and dcgm-exporter cannot name the pod of a
  series on an MPS-shared GPU.

The layouts themselves (which MIG devices exist) are the hosts' business: the ``nvidia_mig``
Ansible role on kubeadm hosts (see docs/sharing.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

# The node label the device plugin's config-manager reads (the chart hard-codes it).
CONFIG_LABEL = "nvidia.com/device-plugin.config"
# The configuration of nodes without the label: whole GPUs, no sharing (the stacks' behaviour
# before sharing existed).
DEFAULT_CONFIG = "default"
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_MODES = ("none", "time-slicing", "mps")
EXPERIMENTAL_SHARING = frozenset({"mps"})
# A label value: at most 63 characters, alphanumeric at both ends, "-", "_" or "." inside.
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
# The MPS control daemon serves at most 48 clients per GPU (the MIG user guide's CUDA
# concurrency table); the device plugin's replicas are those clients.
MAX_MPS_REPLICAS = 48
GPU_RESOURCE = "nvidia.com/gpu"
# dcgm-exporter: the series of a GPU held by several pods are given to each of them (with the
# replica in a `vgpu` label) instead of naming one of them; from 4.5.3 GPU_UTIL and FB_USED are
# also measured per pod (docs/sharing.md, "dcgm-exporter on shared GPUs").
VIRTUAL_GPUS_ENV = "KUBERNETES_VIRTUAL_GPUS"


@dataclass(frozen=True)
class DevicePluginConfig:
    """One named configuration of the device plugin; ValueError says what is wrong with it."""

    name: str
    mig_strategy: str = "none"
    sharing: str = "none"
    replicas: int | None = None
    rename_by_default: bool = True
    fail_requests_greater_than_one: bool = True

    def __post_init__(self) -> None:
        where = f"device plugin config {self.name!r}"
        if not LABEL_VALUE.match(self.name):
            raise ValueError(
                f"{where}: a config name is a node label value (letters, digits, '-', '_', '.', "
                f"at most 63, alphanumeric at both ends)"
            )
        if self.mig_strategy not in MIG_STRATEGIES:
            raise ValueError(
                f"{where}: migStrategy must be one of {', '.join(MIG_STRATEGIES)}, got "
                f"{self.mig_strategy!r}"
            )
        if self.sharing not in SHARING_MODES:
            raise ValueError(
                f"{where}: sharing must be one of {', '.join(SHARING_MODES)}, got {self.sharing!r}"
            )
        if self.sharing == "none":
            if self.replicas is not None:
                raise ValueError(f"{where}: replicas needs sharing time-slicing or mps")
            return
        if self.replicas is None or self.replicas < 2:
            raise ValueError(
                f"{where}: sharing {self.sharing} needs replicas of at least 2 (how many pods "
                f"share one GPU), got {self.replicas}"
            )
        if self.sharing == "mps":
            if self.mig_strategy != "none":
                raise ValueError(
                    f"{where}: the device plugin shares whole GPUs only through MPS, not MIG "
                    f"devices; use migStrategy none, or time-slicing"
                )
            if self.replicas > MAX_MPS_REPLICAS:
                raise ValueError(
                    f"{where}: an MPS server takes at most {MAX_MPS_REPLICAS} clients per GPU, "
                    f"got replicas {self.replicas}"
                )
        if self.sharing == "time-slicing" and self.mig_strategy == "mixed":
            raise ValueError(
                f"{where}: with migStrategy mixed the MIG devices are nvidia.com/mig-<profile> "
                f"resources, which a time-slicing config of {GPU_RESOURCE} does not replicate; "
                f"use migStrategy single (MIG devices as {GPU_RESOURCE}) or none"
            )

    @property
    def shares_gpus(self) -> bool:
        return self.sharing != "none"

    @property
    def experimental(self) -> bool:
        return self.sharing in EXPERIMENTAL_SHARING

    def document(self) -> dict[str, Any]:
        """The device plugin's config file (``version: v1``) for this configuration."""
        document: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": self.mig_strategy}}
        if self.shares_gpus:
            key = "timeSlicing" if self.sharing == "time-slicing" else "mps"
            document["sharing"] = {
                key: {
                    "renameByDefault": self.rename_by_default,
                    "failRequestsGreaterThanOne": self.fail_requests_greater_than_one,
                    "resources": [{"name": GPU_RESOURCE, "replicas": self.replicas}],
                }
            }
        return document


@dataclass(frozen=True)
class GpuSharingArgs:
    """The device plugin configurations node pools may pick, and the one for unlabelled nodes.

    With no configurations the device plugin runs as before: one configuration for every node,
    whole GPUs, no sharing, and no ConfigMap.
    """

    configs: tuple[DevicePluginConfig, ...] = ()
    default: str = DEFAULT_CONFIG

    def __post_init__(self) -> None:
        names = [config.name for config in self.configs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"device plugin config {repeated[0]!r} is defined twice")
        if DEFAULT_CONFIG in names:
            raise ValueError(
                f"device plugin config name {DEFAULT_CONFIG!r} is reserved for nodes without "
                f"the {CONFIG_LABEL} label (whole GPUs); name yours otherwise and set "
                f"default to it"
            )
        if self.default not in (DEFAULT_CONFIG, *names):
            raise ValueError(
                f"default device plugin config {self.default!r} is not defined; "
                f"known: {', '.join([DEFAULT_CONFIG, *names])}"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.configs)

    @property
    def shares_gpus(self) -> bool:
        """Whether any configuration shares GPUs between pods (dcgm-exporter must know)."""
        return any(config.shares_gpus for config in self.configs)

    def all_configs(self) -> list[DevicePluginConfig]:
        return [DevicePluginConfig(DEFAULT_CONFIG), *self.configs]

    def config(self, name: str, where: str) -> DevicePluginConfig:
        """The configuration ``name`` that a node pool (``where``) refers to; ValueError when it
        is not defined."""
        for config in self.all_configs():
            if config.name == name:
                return config
        known = ", ".join(config.name for config in self.all_configs())
        raise ValueError(
            f"{where}: device plugin config {name!r} is not defined in gpuSharing.configs "
            f"(known: {known})"
        )

    def node_labels(self, name: str | None, where: str) -> dict[str, str]:
        """The node label that selects config ``name`` (none for None)."""
        if name is None:
            return {}
        return {CONFIG_LABEL: self.config(name, where).name}


def device_plugin_config_values(sharing: GpuSharingArgs) -> dict[str, Any]:
    """The chart's ``config`` values: every configuration, and the default for unlabelled nodes.

    Flags that are the same everywhere (device list and ID strategy) stay top-level values; the
    MIG strategy lives only in the configurations, since a top-level one would override theirs.
    """
    if not sharing.enabled:
        return {}
    return {
        "config": {
            "map": {
                config.name: yaml.safe_dump(config.document(), sort_keys=False)
                for config in sharing.all_configs()
            },
            "default": sharing.default,
        }
    }


def with_virtual_gpus(values: Mapping[str, Any], sharing: GpuSharingArgs) -> dict[str, Any]:
    """dcgm-exporter's values where GPUs are shared: ``KUBERNETES_VIRTUAL_GPUS`` on, and what the
    exporter needs to measure each pod's own GPU_UTIL and FB_USED.

    Its per-pod figures come from NVML's per-process accounting: it maps each process to its pod
    by the pod UID in ``/proc/<pid>/cgroup`` (it needs the host's PIDs, ``hostPID``) and knows
    each pod's UID from the API server (the chart mounts the service-account token and grants
    read access to pods only with ``kubernetes.enablePodUID`` or ``enablePodLabels``). Without
    either, every pod of a GPU reads 0. ``enablePodUID`` also labels every pod's copy with
    ``pod_uid``; ``enablePodLabels`` would copy all pod labels, which only adds cardinality.
    """
    result = dict(values)
    if sharing.shares_gpus:
        result["extraEnv"] = [
            *values.get("extraEnv", []),
            {"name": VIRTUAL_GPUS_ENV, "value": "true"},
        ]
        result["hostPID"] = True
        result["kubernetes"] = {
            **values.get("kubernetes", {}),
            "enablePodUID": True,
            "rbac": {"create": True},
        }
    return result


# EC2 instance families whose NVIDIA GPUs cannot be split with MIG (T4, A10G, L4, L40S, V100).
NON_MIG_FAMILIES = frozenset({"g4dn", "g5", "g5g", "g6", "g6e", "g6f", "gr6", "p3", "p3dn"})


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def require_mig_capable(
    config: DevicePluginConfig, instance_families: Iterable[str], where: str
) -> None:
    """Refuse a MIG strategy on a pool whose every instance family has GPUs without MIG."""
    families = sorted(set(instance_families))
    if config.mig_strategy != "none" and families and set(families) <= NON_MIG_FAMILIES:
        raise ValueError(
            f"{where}: device plugin config {config.name!r} sets migStrategy "
            f"{config.mig_strategy}, but the GPUs of {', '.join(families)} have no MIG (it needs "
            f"A100, A30, H100, H200 or later: p4d, p4de, p5, p5e, p5en)"
        )
