"""The session's playbook runs against the booted nodes, done once and shared by every test.

Order: a --check run on the fresh nodes; a run with the stand-in vendor repositories stopped,
which fails half-way (on Debian after the driver is installed); a run of the Ubuntu workers alone,
whose driver is then installed but not loaded (they must stop before joining); then the driver is
"loaded" (the stand-in for the reboot the operator is told to do); a run whose first kubeadm init
fails (the stand-in kubeadm told to, after writing admin.conf like a real failed init); the
converging run, on a cluster where the last worker carries the remains of a join that failed
half-way (kubelet.conf written, the node never registered); an idempotent rerun. Then a Docker
image is imported on each node for the `docker run` checks, and a last run of the NVSwitch node
finds its Fabric Manager unable to start.
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
    # Debian's real nvidia-smi cannot work without a GPU: the check before joining runs on the
    # Ubuntu nodes, against the stand-in driver.
    "gpu-cp-1": {"nvidia_driver_verify_before_join": False},
    "gpu-worker-2": {
        "nvidia_driver_kernel_modules": "proprietary",
        "nvidia_driver_fabricmanager": True,
        # Its CDI refresh units in /etc/systemd/system, the newest toolkit's in /lib/systemd/system.
        "nvidia_container_toolkit_version": "1.18.0-1",
    },
}
# What stands for a loaded driver on the Ubuntu nodes (the stand-in nvidia-smi reads it), and for
# a Fabric Manager that does not match the driver (the stand-in daemon exits).
DRIVER_LOADED = "/run/nvidia-standin/driver-loaded"
FABRIC_MISMATCH = "/run/nvidia-standin/fabric-mismatch"
STANDIN_DRIVER_NODES = WORKERS  # the Ubuntu nodes
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
    unloaded_run: RunResult  # the GPU workers' driver installed, not loaded: they must not join
    failed_init_run: RunResult
    converge_run: RunResult
    rerun: RunResult
    image: str
    fabric_mismatch_run: RunResult  # Fabric Manager not matching the driver on the NVSwitch node


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
    limit = ",".join(STANDIN_DRIVER_NODES)
    unloaded_run = run_playbook(
        "site.yml", inventory, "--limit", limit, log=workdir / "unloaded.log"
    )
    for name in STANDIN_DRIVER_NODES:  # the operator reboots them: the driver is loaded
        cluster.node(name).run(f"mkdir -p {Path(DRIVER_LOADED).parent} && touch {DRIVER_LOADED}")
    control_plane = cluster.node(CONTROL_PLANE[0])
    control_plane.run(f"mkdir -p {Path(FAIL_NEXT_INIT).parent} && touch {FAIL_NEXT_INIT}")
    failed_init_run = run_playbook("site.yml", inventory, log=workdir / "failed-init.log")
    half_joined = cluster.node(HALF_JOINED_WORKER)
    half_joined.run("mkdir -p /etc/kubernetes")
    (half_joined.root / "etc/kubernetes/kubelet.conf").write_text(HALF_JOINED_KUBELET_CONF)
    converge_run = run_playbook("site.yml", inventory, log=workdir / "converge.log")
    rerun = run_playbook("site.yml", inventory, log=workdir / "rerun.log")
    image = import_image(cluster) if converge_run.returncode == 0 else ""
    fabric_mismatch_run = fabric_mismatch(cluster, inventory, workdir)
    return Provisioned(
        cluster,
        inventory,
        check_run,
        interrupted_run,
        unloaded_run,
        failed_init_run,
        converge_run,
        rerun,
        image,
        fabric_mismatch_run,
    )


def fabric_mismatch(cluster: Cluster, inventory: Path, workdir: Path) -> RunResult:
    """Fabric Manager stops and cannot start again (another version than the driver's): the
    NVSwitch node's next run stops before the join step. The node is healthy again afterwards."""
    node = cluster.node("gpu-worker-2")
    node.run(f"touch {FABRIC_MISMATCH} && systemctl stop nvidia-fabricmanager")
    try:
        return run_playbook(
            "kubeadm_cluster.yml",
            inventory,
            "--limit",
            node.name,
            log=workdir / "fabric-mismatch.log",
        )
    finally:
        node.run(f"rm -f {FABRIC_MISMATCH} && systemctl start nvidia-fabricmanager")
