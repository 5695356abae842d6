"""The session's playbook runs against the booted nodes, done once and shared by every test.

Order: a --check run on the fresh nodes; a run with the stand-in vendor repositories stopped,
which fails half-way (on Debian after the driver is installed); a run whose first kubeadm init
fails (the stand-in kubeadm told to, after writing admin.conf like a real failed init); the
converging run, on a cluster where the last worker carries the remains of a join that failed
half-way (kubelet.conf written, the node never registered); an idempotent rerun. Then a Docker
image is imported on each node for the `docker run` checks.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.nodes.harness import rootfs
from tests.nodes.harness.ansible_run import RunResult, run_playbook
from tests.nodes.harness.cluster import DEFAULT_NODE_NAMES, Cluster
from tests.nodes.harness.machine import Node

CONTROL_PLANE = DEFAULT_NODE_NAMES[:1]
WORKERS = DEFAULT_NODE_NAMES[1:]
IMAGE = "gpu-cluster-tests/debian:12"
# What the tests change from the role defaults, and why.
TEST_VARS: dict[str, Any] = {
    # The DKMS build of the driver takes about 7 minutes and cannot load without a GPU anyway.
    "nvidia_driver_install_kernel_headers": False,
    "kubeadm_cluster_name": "gct",
    # The stand-in API server answers at once: no need to wait two minutes for a failed init.
    "kubeadm_control_plane_readyz_retries": 2,
    "kubeadm_control_plane_readyz_delay": 1,
}
# Per node: the Ubuntu 24.04 worker takes the other kernel module flavour and Fabric Manager
# (as on an NVSwitch system; the PCI bus here has none), the others the defaults (open, auto).
NODE_VARS: dict[str, dict[str, Any]] = {
    "gpu-worker-2": {
        "nvidia_driver_kernel_modules": "proprietary",
        "nvidia_driver_fabricmanager": True,
    },
}
FAIL_NEXT_INIT = "/var/lib/kubeadm-standin/fail-next-init"
# What a kubeadm join that failed after writing kubelet.conf leaves on a worker.
HALF_JOINED_WORKER = WORKERS[-1]
HALF_JOINED_KUBELET_CONF = "# remains of a kubeadm join that failed half-way\n"


@dataclass
class Provisioned:
    cluster: Cluster
    inventory: Path
    check_run: RunResult
    interrupted_run: RunResult
    failed_init_run: RunResult
    converge_run: RunResult
    rerun: RunResult
    image: str


def inventory_for(cluster: Cluster, path: Path, names: list[str] | None = None) -> Path:
    """Inventory: every node a GPU node, the first one the control plane, the others workers."""
    names = names or [node.name for node in cluster.nodes]
    return cluster.write_inventory(
        path,
        {"gpu_nodes": names, "control_plane": names[:1], "workers": names[1:]},
        {**TEST_VARS, "kubeadm_control_plane_kubeconfig_dest": str(path.parent / "admin.conf")},
        {name: NODE_VARS[name] for name in names if name in NODE_VARS},
    )


def import_image(cluster: Cluster) -> str:
    """`docker import` the cached root filesystem tarball on every node (no image can be pulled)."""
    tarball = rootfs.ensure_tarball()

    def load(node: Node) -> None:
        with subprocess.Popen(["zstd", "-dc", str(tarball)], stdout=subprocess.PIPE) as unzstd:
            subprocess.run(
                ["nsenter", "-t", str(node.leader), "-a", "docker", "import", "-", IMAGE],
                stdin=unzstd.stdout,
                check=True,
                capture_output=True,
                timeout=300,
            )

    with ThreadPoolExecutor(len(cluster.nodes)) as pool:
        list(pool.map(load, cluster.nodes))
    return IMAGE


def provision(cluster: Cluster, workdir: Path) -> Provisioned:
    inventory = inventory_for(cluster, workdir / "inventory.yml")
    check_run = run_playbook("site.yml", inventory, "--check", log=workdir / "check.log")
    assert cluster.repo is not None
    cluster.repo.stop()
    try:
        interrupted_run = run_playbook("site.yml", inventory, log=workdir / "interrupted.log")
    finally:
        cluster.repo.start()
    control_plane = cluster.node(CONTROL_PLANE[0])
    control_plane.run(f"mkdir -p {Path(FAIL_NEXT_INIT).parent} && touch {FAIL_NEXT_INIT}")
    failed_init_run = run_playbook("site.yml", inventory, log=workdir / "failed-init.log")
    half_joined = cluster.node(HALF_JOINED_WORKER)
    half_joined.run("mkdir -p /etc/kubernetes")
    (half_joined.root / "etc/kubernetes/kubelet.conf").write_text(HALF_JOINED_KUBELET_CONF)
    converge_run = run_playbook("site.yml", inventory, log=workdir / "converge.log")
    rerun = run_playbook("site.yml", inventory, log=workdir / "rerun.log")
    image = import_image(cluster) if converge_run.returncode == 0 else ""
    return Provisioned(
        cluster,
        inventory,
        check_run,
        interrupted_run,
        failed_init_run,
        converge_run,
        rerun,
        image,
    )
