"""What a kubeadm stack's Ansible inventory says about the cluster the playbooks will build.

Read with Ansible's own inventory loader (INI, YAML or a folder, with its group_vars and host_vars),
with the stack's extra variables on top, as ``ansible-playbook -e`` would see them. From it:

- the nodes: every host of ``control_plane`` and ``workers``, with the label and taints the
  ``kubeadm_control_plane`` and ``kubeadm_worker`` roles register it with (their variables and
  defaults, see playbooks/README.md);
- the API server's address as this machine reaches it (the control-plane host's ``ansible_host``,
  or ``kubeadm_control_plane_endpoint``), which the fetched admin kubeconfig must point at.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import versions
from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE
from infra.scheduling import (
    CONTROL_PLANE_ROLE,
    CONTROL_PLANE_TAINT,
    GPU_TAINT,
    NodePool,
    PodPlacement,
    Taint,
    fitting_pools,
)

API_SERVER_PORT = 6443  # kubeadm's default bind port
GPU_GROUP = "gpu_nodes"
CONTROL_PLANE_GROUP = "control_plane"
WORKER_GROUP = "workers"


class InventoryError(ValueError):
    """The inventory cannot describe a cluster; the message says what to change."""


@dataclass(frozen=True)
class KubeadmNode:
    """A host that joins the cluster, as the roles register it."""

    name: str
    address: str
    control_plane: bool
    gpu: bool
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    variables: Mapping[str, Any]

    def pool(self) -> NodePool:
        return NodePool(name=self.name, labels=self.labels, taints=self.taints)


def _truthy(value: Any) -> bool:
    from ansible.module_utils.parsing.convert_bool import boolean  # noqa: PLC0415

    return bool(boolean(value, strict=False))


def _node(name: str, variables: Mapping[str, Any]) -> KubeadmNode | None:
    groups = set(variables.get("group_names", ()))
    control_plane = CONTROL_PLANE_GROUP in groups
    if not control_plane and WORKER_GROUP not in groups:
        return None
    role = "kubeadm_control_plane" if control_plane else "kubeadm_worker"
    gpu = _truthy(variables.get(f"{role}_gpu_node", GPU_GROUP in groups))
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    taints: list[Taint] = []
    if control_plane:
        labels[CONTROL_PLANE_ROLE] = ""
        if not _truthy(variables.get("kubeadm_control_plane_schedulable", False)):
            taints.append(CONTROL_PLANE_TAINT)
    if gpu:
        labels.update(
            variables.get(f"{role}_gpu_node_labels", {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE})
        )
        if _truthy(variables.get(f"{role}_gpu_node_taint_enabled", True)):
            taint = variables.get(f"{role}_gpu_node_taint")
            taints.append(
                Taint(key=taint["key"], value=str(taint.get("value", "")), effect=taint["effect"])
                if taint
                else GPU_TAINT
            )
    return KubeadmNode(
        name=name,
        address=str(variables.get("ansible_host") or name),
        control_plane=control_plane,
        gpu=gpu,
        labels=labels,
        taints=tuple(taints),
        variables=variables,
    )


def read_nodes(inventory: Path, extra_vars: Mapping[str, Any] | None = None) -> list[KubeadmNode]:
    """The cluster's nodes; raises InventoryError when the inventory has no single control plane."""
    from ansible.inventory.manager import InventoryManager  # noqa: PLC0415
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
    from ansible.template import Templar  # noqa: PLC0415
    from ansible.vars.manager import VariableManager  # noqa: PLC0415

    if not inventory.exists():
        raise InventoryError(f"Ansible inventory not found: {inventory}")
    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(inventory)])
    variable_manager = VariableManager(loader=loader, inventory=hosts)
    nodes = []
    for host in hosts.get_hosts():
        variables = {**variable_manager.get_vars(host=host), **(extra_vars or {})}
        rendered = Templar(loader=loader, variables=variables).template(variables)
        node = _node(host.name, rendered)
        if node is not None:
            nodes.append(node)
    control_planes = [n.name for n in nodes if n.control_plane]
    if len(control_planes) != 1:
        raise InventoryError(
            f"{inventory}: the {CONTROL_PLANE_GROUP} group must hold exactly one host "
            f"(kubeadm init runs there), found {control_planes or 'none'}"
        )
    return nodes


def control_plane(nodes: list[KubeadmNode]) -> KubeadmNode:
    return next(n for n in nodes if n.control_plane)


def api_server_url(nodes: list[KubeadmNode]) -> str:
    """The API server as this machine reaches it: the endpoint if one is set, else the host."""
    host = control_plane(nodes)
    endpoint = str(host.variables.get("kubeadm_control_plane_endpoint") or "")
    if endpoint:
        return f"https://{endpoint}" if ":" in endpoint else f"https://{endpoint}:{API_SERVER_PORT}"
    address = host.address
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass  # a host name
    return f"https://{address}:{API_SERVER_PORT}"


def kubernetes_version(nodes: list[KubeadmNode]) -> str:
    """The version the control plane installs (``kubernetes_node_version``), else the pinned one."""
    version = control_plane(nodes).variables.get("kubernetes_node_version")
    return str(version) if version else versions.KUBEADM_KUBERNETES_VERSION


def system_pods_fit(nodes: list[KubeadmNode]) -> bool:
    """Whether a pod that tolerates nothing (Prometheus, Grafana, ...) can run on some node."""
    return bool(fitting_pools(PodPlacement(), [node.pool() for node in nodes]))
