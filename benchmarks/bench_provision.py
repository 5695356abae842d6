"""Provisioning time with Ansible: one and four booted Debian test nodes at once, plus the rerun.

Run by hand as root, after the node tests ran once (so the root filesystem tarball and
apt-cacher-ng's cache are warm):

    sudo .venv/bin/python benchmarks/bench_provision.py [--nodes 1 4]

Set ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks for per-task times in the logs (--logs).
Each size boots fresh nodes (systemd-nspawn, see tests/nodes/README.md), runs playbooks/site.yml
(first node control plane, the others workers, all GPU nodes), then runs it again (must change
nothing). Node mix: Debian 12 first (Debian's real headless driver, open modules, without kernel
headers; docker.io), then Ubuntu 22.04 and 24.04 (the Debian userland with Ubuntu's os-release;
stand-in CUDA driver and Docker CE packages), then Debian again: four nodes are Debian x2, Ubuntu
22.04, Ubuntu 24.04. Toolkit and Kubernetes packages are stand-ins everywhere.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.nodes.harness import rootfs
from tests.nodes.harness.ansible_run import run_playbook
from tests.nodes.harness.aptproxy import CACHE_DIR
from tests.nodes.harness.cluster import missing_requirements, running_cluster
from tests.nodes.harness.provision import inventory_for


def cache_state() -> str:
    tarball = "cached" if rootfs.tarball_path().exists() else "absent (debootstrap will run)"
    debs = sum(1 for _ in (CACHE_DIR / "apt-cacher-ng").rglob("*.deb"))
    return f"root filesystem tarball {tarball}; {debs} .debs in apt-cacher-ng's cache"


# The system of the first, second, ... node of a benchmark cluster.
NODE_MIX = ("debian12", "ubuntu2204", "ubuntu2404", "debian12")


def measure(size: int, workdir: Path, logs: Path) -> dict[str, float]:
    names = [f"bench-{index}" for index in range(1, size + 1)]
    systems = {name: NODE_MIX[index % len(NODE_MIX)] for index, name in enumerate(names)}
    started = time.monotonic()
    with running_cluster(workdir / f"nodes-{size}", names, systems) as cluster:
        booted = time.monotonic() - started
        inventory = inventory_for(cluster, workdir / f"inventory-{size}.yml")
        first = run_playbook("site.yml", inventory, log=logs / f"site-{size}.log")
        if first.returncode != 0:
            raise SystemExit(f"site.yml failed on {size} node(s): see {logs}/site-{size}.log")
        second = run_playbook("site.yml", inventory, log=logs / f"rerun-{size}.log")
        if second.returncode != 0 or second.total("changed") != 0:
            raise SystemExit(f"rerun not clean on {size} node(s): {second.recap}")
    return {"boot": booted, "site": first.seconds, "rerun": second.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--logs",
        type=Path,
        default=Path("/tmp/bench-provision-logs"),
        help="where the playbook logs are kept (default: %(default)s)",
    )
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    reason = missing_requirements()
    if reason:
        raise SystemExit(reason)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, kernel {platform.release()}")
    print(f"cache before: {cache_state()}")
    with tempfile.TemporaryDirectory(prefix="bench-provision-") as scratch:
        results = {size: measure(size, Path(scratch), args.logs) for size in args.nodes}
    print(f"load average after: {' '.join(f'{load:.1f}' for load in os.getloadavg())}")
    print("| nodes | systems | boot (s) | site.yml (s) | rerun, changed=0 (s) |")
    print("|---|---|---|---|---|")
    for size, times in results.items():
        systems = ", ".join(NODE_MIX[index % len(NODE_MIX)] for index in range(size))
        print(
            f"| {size} | {systems} | {times['boot']:.0f} | {times['site']:.0f} "
            f"| {times['rerun']:.0f} |"
        )


if __name__ == "__main__":
    main()
