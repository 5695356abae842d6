"""KubeadmCluster: a kubeadm cluster on existing hosts, built by the project's Ansible playbooks.

Pulumi runs ``playbooks/gpu_nodes.yml`` and ``playbooks/kubeadm_cluster.yml`` through
``pulumi_command`` against the inventory of the stack, re-running them whenever the playbook tree,
the inventory or the variables change, then reads back the admin kubeconfig the playbooks fetched,
pointed at the control plane's address as this machine reaches it (the inventory's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s
import yaml

from infra import ansible_run, kubeadm_inventory
from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE
from infra.gpu_sharing import GpuSharingArgs
from infra.kubeadm_inventory import InventoryError, KubeadmNode

REPO_ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK_DIR = REPO_ROOT / "playbooks"
DEFAULT_PLAYBOOKS = ("gpu_nodes.yml", "kubeadm_cluster.yml")
# Generated files in the playbook tree that must not trigger a re-run.
IGNORED_PARTS = frozenset({"artifacts", "__pycache__", ".ansible"})


def tree_digest(root: Path, ignored: Iterable[str] = IGNORED_PARTS) -> str:
    """SHA-256 over the relative paths and contents of every file under ``root``."""
    skip = frozenset(ignored)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root)
        if skip.intersection(relative.parts):
            continue
        digest.update(str(relative).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of one file's content."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class KubeadmClusterArgs:
    """Where the hosts are and how to reach them."""

    cluster_name: str
    inventory: str  # an Ansible inventory: a file, or a folder with group_vars/host_vars
    extra_vars: dict[str, Any] = field(default_factory=dict)
    playbook_dir: Path = PLAYBOOK_DIR
    playbooks: tuple[str, ...] = DEFAULT_PLAYBOOKS
    ssh_private_key_file: str | None = None
    # Secrets: pass Pulumi secrets (config set with --secret); they reach Ansible through files.
    ssh_key_passphrase: pulumi.Input[str] | None = None
    become_password: pulumi.Input[str] | None = None
    kubeconfig_dest: str | None = None  # default: playbooks/artifacts/<cluster>/admin.conf

    def kubeconfig_path(self) -> Path:
        if self.kubeconfig_dest:
            return Path(self.kubeconfig_dest).resolve()
        return self.playbook_dir / "artifacts" / self.cluster_name / "admin.conf"

    def all_extra_vars(self, cert_sans: list[str] | None = None) -> dict[str, Any]:
        extra = {
            **self.extra_vars,
            "kubeadm_cluster_name": self.cluster_name,
            "kubeadm_control_plane_kubeconfig_dest": str(self.kubeconfig_path()),
        }
        if cert_sans:
            extra["kubeadm_control_plane_cert_sans"] = cert_sans
        return extra


def require_system_node(nodes: list[KubeadmNode], inventory: Path) -> None:
    """Refuse an inventory where Prometheus, Grafana and the operators could run nowhere."""
    if kubeadm_inventory.system_pods_fit(nodes):
        return
    tainted = "; ".join(
        f"{n.name}: {', '.join(t.key for t in n.taints)}" for n in nodes if n.taints
    )
    raise InventoryError(
        f"{inventory}: every node is tainted ({tainted}), so the cluster's services (Prometheus, "
        f"Grafana, the operators) could run nowhere and the install would time out. Add a worker "
        f"that is not in gpu_nodes, or set kubeadm_control_plane_schedulable: true"
    )


def api_server_names(nodes: list[KubeadmNode]) -> list[str]:
    """The control plane's certificate SANs: the inventory's, plus the address used to reach it."""
    host = kubeadm_inventory.control_plane(nodes)
    names = [str(name) for name in host.variables.get("kubeadm_control_plane_cert_sans") or ()]
    if not host.variables.get("kubeadm_control_plane_endpoint") and host.address not in names:
        names.append(host.address)
    return names


def point_kubeconfig(kubeconfig: str, server: str) -> str:
    """The kubeconfig with every cluster's server set to ``server``.

    kubeadm writes the address the API server advertises (its default route's), which need not be
    one this machine can reach; the inventory's address is one it reaches over SSH already.
    """
    document = yaml.safe_load(kubeconfig) if kubeconfig else None
    if not isinstance(document, dict):
        return kubeconfig
    for cluster in document.get("clusters") or ():
        cluster.setdefault("cluster", {})["server"] = server
    return yaml.safe_dump(document, sort_keys=False)


class KubeadmCluster(pulumi.ComponentResource):
    """Hosts turned into a GPU-ready kubeadm cluster; exposes the admin kubeconfig as a secret."""

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]

    def __init__(
        self, name: str, args: KubeadmClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-cluster:index:KubeadmCluster", name, None, opts)
        inventory = Path(args.inventory).resolve()
        nodes = kubeadm_inventory.read_nodes(inventory, args.extra_vars)
        require_system_node(nodes, inventory)
        server = kubeadm_inventory.api_server_url(nodes)
        playbooks = [args.playbook_dir / playbook for playbook in args.playbooks]
        extra_vars = json.dumps(args.all_extra_vars(api_server_names(nodes)), sort_keys=True)

        environment: dict[str, pulumi.Input[str]] = {
            ansible_run.ENV_INVENTORY: str(inventory),
            ansible_run.ENV_PLAYBOOKS: os.pathsep.join(str(p) for p in playbooks),
            ansible_run.ENV_EXTRA_VARS: extra_vars,
        }
        if args.ssh_private_key_file:
            environment[ansible_run.ENV_PRIVATE_KEY] = args.ssh_private_key_file
        if args.ssh_key_passphrase is not None:
            environment[ansible_run.ENV_KEY_PASSPHRASE] = pulumi.Output.secret(
                args.ssh_key_passphrase
            )
        if args.become_password is not None:
            environment[ansible_run.ENV_BECOME_PASSWORD] = pulumi.Output.secret(
                args.become_password
            )

        triggers = [
            tree_digest(args.playbook_dir) if args.playbook_dir.is_dir() else "no-playbooks",
            tree_digest(inventory) if inventory.is_dir() else file_digest(inventory),
            hashlib.sha256(extra_vars.encode()).hexdigest(),
        ]
        self.provision = command.local.Command(
            f"{name}-playbooks",
            create=f"{shlex.quote(sys.executable)} -m infra.ansible_run",
            dir=str(REPO_ROOT),
            environment=environment,
            triggers=triggers,
            # Ansible's output names hosts and tasks, not secrets; keep it out of Pulumi's log.
            logging=command.local.Logging.STDERR,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["stdout"]),
        )
        kubeconfig_read = command.local.Command(
            f"{name}-kubeconfig",
            create=f"cat {shlex.quote(str(args.kubeconfig_path()))}",
            triggers=triggers,
            logging=command.local.Logging.NONE,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.provision], additional_secret_outputs=["stdout"]
            ),
        )

        self.cluster_name = pulumi.Output.from_input(args.cluster_name)
        self.kubeconfig = pulumi.Output.secret(
            kubeconfig_read.stdout.apply(lambda text: point_kubeconfig(text, server))
        )
        self.register_outputs({"cluster_name": self.cluster_name, "kubeconfig": self.kubeconfig})


def gpu_node_names(value: object) -> list[str]:
    """The kubeadm stack's optional ``gpuNodeNames``: a list of node names, or nothing."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise ValueError(f"gpuNodeNames must be a list of Kubernetes node names, got {value!r}")
    return list(value)


def gpu_node_configs(value: object, sharing: GpuSharingArgs) -> dict[str, str]:
    """The kubeadm stack's optional ``gpuNodeConfigs``: node name -> device plugin config."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(node, str) and node and isinstance(name, str) and name
        for node, name in value.items()
    ):
        raise ValueError(
            f"gpuNodeConfigs must map Kubernetes node names to device plugin config names, "
            f"got {value!r}"
        )
    for node, name in value.items():
        sharing.config(name, f"gpuNodeConfigs.{node}")
    return dict(value)


def label_gpu_nodes(
    node_names: list[str],
    provider: k8s.Provider,
    node_configs: dict[str, str] | None = None,
    sharing: GpuSharingArgs | None = None,
) -> list[k8s.core.v1.NodePatch]:
    """Label nodes: ``node_names`` as GPU nodes (e.g. nodes that joined before the playbooks
    labelled them), ``node_configs``' nodes with the device plugin configuration they use.

    The playbooks register every ``gpu_nodes`` host with the GPU label and taint themselves; this
    is for nodes they did not register, and for the configuration label, which the device plugin
    follows whenever it changes. One server-side-apply patch of these labels per node: the rest of
    each Node stays the kubelet's.
    """
    configs = node_configs or {}
    patches = []
    for node in sorted({*node_names, *configs}):
        labels = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE} if node in node_names else {}
        labels |= (sharing or GpuSharingArgs()).node_labels(
            configs.get(node), f"gpuNodeConfigs.{node}"
        )
        patches.append(
            k8s.core.v1.NodePatch(
                f"gpu-node-label-{node}",
                metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=labels),
                opts=pulumi.ResourceOptions(provider=provider),
            )
        )
    return patches
