"""A set of booted nodes plus the host services they use: apt proxy and stand-in repositories."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.nodes.harness import rootfs, standin_repo
from tests.nodes.harness.aptproxy import AptProxy
from tests.nodes.harness.machine import UBUNTU_OS_RELEASE, Node, free_index, reap_stale_nodes

# Hostnames (and inventory names) of the default test cluster and the system each says it is:
# the control plane on Debian 12 (real driver packages), one worker per Ubuntu release.
DEFAULT_NODES = {"gpu-cp-1": "debian12", "gpu-worker-1": "ubuntu2204", "gpu-worker-2": "ubuntu2404"}
DEFAULT_NODE_NAMES = list(DEFAULT_NODES)
REQUIRED_TOOLS = (
    "debootstrap",
    "systemd-nspawn",
    "apt-cacher-ng",
    "dpkg-deb",
    "gpg",
    "zstd",
    "ssh",
    "ssh-keygen",
    "nsenter",
    "pgrep",
    "ip",
)


def missing_requirements() -> str | None:
    """Why nodes cannot boot on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "booting test nodes needs root (systemd-nspawn, veth, cgroups)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing tools for test nodes: {', '.join(missing)}"
    if not Path("/sys/fs/cgroup/unified").is_dir():
        return "no hybrid cgroup hierarchy (/sys/fs/cgroup/unified) to start nodes from"
    return None


@dataclass
class Cluster:
    """Nodes booted from the cached Debian 12 tarball, each on its own veth pair."""

    workdir: Path
    names: list[str]
    # Node name -> system (machine.SYSTEMS); Debian 12 when not given.
    systems: dict[str, str] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    proxy: AptProxy | None = None
    repo: standin_repo.RepositoryServer | None = None

    @property
    def ssh_key(self) -> Path:
        return self.workdir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        reap_stale_nodes()
        tarball = rootfs.ensure_tarball()
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh_key)], check=True
        )
        # Two harness runs at once (tests and a benchmark) must not pick the same subnets.
        with (rootfs.CACHE_DIR / "subnets.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index = 0
            for name in self.names:
                index = free_index(index + 1)
                system = self.systems.get(name, "debian12")
                self.nodes.append(Node(name, index, self.workdir / name, self.ssh_key, system))
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda node: node.prepare(tarball), self.nodes))
            for node in self.nodes:
                node.boot()
        self.known_hosts.write_text(
            "".join(
                f"{node.address} {key}\n" for node in self.nodes for key in node.host_public_keys
            )
        )
        addresses = [node.host_address for node in self.nodes]
        self.proxy = AptProxy(self.workdir / "apt-cacher-ng", addresses)
        self.proxy.start()
        engine = None
        if any(node.system in UBUNTU_OS_RELEASE for node in self.nodes):
            engine = standin_repo.fetch_debian_deb(
                "docker.io", self.proxy.url(addresses[0]), rootfs.CACHE_DIR / "standin-debs"
            )
        standin_repo.build_repositories(self.workdir / "www", engine)
        self.repo = standin_repo.RepositoryServer(self.workdir / "www", addresses)

    def stop(self) -> None:
        """Tear everything down; every step runs even if an earlier one failed."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.poweroff()
        if self.proxy is not None:
            self.proxy.stop()
        if self.repo is not None:
            self.repo.stop()
        for node in self.nodes:
            node.remove()

    def host_vars(self, node: Node) -> dict[str, Any]:
        """What one node needs to reach the proxy and the stand-in repositories over SSH."""
        assert self.proxy is not None
        assert self.repo is not None
        base = self.repo.base_url(node.host_address)
        # One repository per minor version, as pkgs.k8s.io has them: Ansible templates the minor
        # where the kubernetes_node role uses it, so the repository follows kubernetes_node_version.
        minor = "{{ kubernetes_node_version.split('.')[:2] | join('.') }}"
        kubernetes_repo = f"{base}/{standin_repo.kubernetes_repo(minor)}/"
        ubuntu = (
            {
                "nvidia_driver_ubuntu_repo_url": (f"{base}/{standin_repo.cuda_repo(node.system)}/"),
                "container_runtime_docker_repo_url": f"{base}/{standin_repo.DOCKER_REPO}",
            }
            if node.system in UBUNTU_OS_RELEASE
            else {}
        )
        return {
            "ansible_host": node.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.ssh_key),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes"
            ),
            "ansible_python_interpreter": "/usr/bin/python3",
            "apt_proxy_url": self.proxy.url(node.host_address),
            # The stand-in repositories are on the host itself, not behind the proxy.
            "apt_proxy_direct_hosts": [node.host_address],
            "nvidia_container_toolkit_repo_url": (f"{base}/libnvidia-container/stable/deb/$(ARCH)"),
            "nvidia_container_toolkit_repo_key_url": f"{base}/{standin_repo.NVIDIA_KEY}",
            "kubernetes_node_repo_url": kubernetes_repo,
            "kubernetes_node_repo_key_url": f"{kubernetes_repo}Release.key",
            "kubeadm_control_plane_cni_manifest_url": f"{base}/{standin_repo.CNI_MANIFEST}",
            **ubuntu,
        }

    def write_inventory(
        self,
        path: Path,
        groups: dict[str, list[str]],
        group_vars: dict[str, Any] | None = None,
        node_vars: dict[str, dict[str, Any]] | None = None,
    ) -> Path:
        """Write a YAML inventory: groups maps a group name to node names; node_vars adds host
        variables to the named nodes."""
        extra = node_vars or {}
        inventory: dict[str, Any] = {
            "all": {
                "hosts": {
                    node.name: {**self.host_vars(node), **extra.get(node.name, {})}
                    for node in self.nodes
                },
                "vars": group_vars or {},
                "children": {
                    group: {"hosts": dict.fromkeys(members)} for group, members in groups.items()
                },
            }
        }
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        return path


@contextlib.contextmanager
def running_cluster(
    workdir: Path, names: list[str], systems: dict[str, str] | None = None
) -> Iterator[Cluster]:
    cluster = Cluster(workdir, names, systems or {})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
