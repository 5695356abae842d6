"""The session's playbook runs against the booted nodes, done once and shared by every test.

Order: a --check run on the fresh nodes; a run with the stand-in vendor repositories stopped,
which fails half-way (after the driver and Docker are installed); the converging run once they are
back; an idempotent rerun. Then a Docker image is imported on each node for the `docker run` checks.
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
}


@dataclass
class Provisioned:
    cluster: Cluster
    inventory: Path
    check_run: RunResult
    interrupted_run: RunResult
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
    converge_run = run_playbook("site.yml", inventory, log=workdir / "converge.log")
    rerun = run_playbook("site.yml", inventory, log=workdir / "rerun.log")
    image = import_image(cluster) if converge_run.returncode == 0 else ""
    return Provisioned(cluster, inventory, check_run, interrupted_run, converge_run, rerun, image)
