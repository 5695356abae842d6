"""The harness itself: booted nodes, SSH, the apt proxy and the signed stand-in repositories.

Test doubles: the stand-in vendor packages (tests/nodes/standin/) replace NVIDIA's container
toolkit and Kubernetes packages, whose repositories cannot be reached from this machine.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.nodes.harness import standin_repo
from tests.nodes.harness.ansible_run import run_module
from tests.nodes.harness.cluster import Cluster, missing_requirements, running_cluster
from tests.nodes.harness.machine import reap_stale_nodes

pytestmark = [pytest.mark.nodes, pytest.mark.slow]


@pytest.fixture(scope="module")
def ping_inventory(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("harness") / "inventory.yml"
    return cluster.write_inventory(path, {"gpu_nodes": [node.name for node in cluster.nodes]})


def test_nodes_boot_with_systemd_as_pid1(cluster: Cluster) -> None:
    for node in cluster.nodes:
        assert node.run("cat /proc/1/comm").stdout.strip() == "systemd"
        # "degraded" (exit status 1) once provisioned: units that need a GPU fail without one.
        state = node.run("systemctl is-system-running", check=False).stdout.strip()
        assert state in {"running", "degraded"}, state
        assert node.run("hostname").stdout.strip() == node.name
        # Each node has its own network namespace: its veth end, loopback, nothing of the host's.
        links = set(node.run("ls /sys/class/net").stdout.split())
        assert {"host0", "lo"} <= links
        host_links = {path.name for path in Path("/sys/class/net").iterdir()} - {"lo"}
        assert not links & host_links


def test_ansible_reaches_every_node_over_ssh_with_checked_host_keys(
    cluster: Cluster, ping_inventory: Path
) -> None:
    result = run_module("all", ping_inventory, "ping", "")
    assert result.returncode == 0, result.describe()
    for node in cluster.nodes:
        assert f"{node.name} | SUCCESS" in result.output


def test_adhoc_apt_install_goes_through_the_proxy(cluster: Cluster, ping_inventory: Path) -> None:
    node = cluster.nodes[0]
    assert cluster.proxy is not None
    proxy = cluster.proxy.url(node.host_address)
    apt = f"http_proxy={proxy} DEBIAN_FRONTEND=noninteractive apt-get -q"
    result = run_module(
        node.name,
        ping_inventory,
        "shell",
        f"{apt} update && {apt} install -y hello && hello && {apt} purge -y hello",
    )
    assert result.returncode == 0, result.describe()
    assert "Hello, world!" in result.output
    assert "hello" in (cluster.proxy.workdir / "log" / "apt-cacher.log").read_text()


def test_proxy_refuses_hosts_other_than_debians_archive(cluster: Cluster) -> None:
    assert cluster.proxy is not None
    proxy = cluster.proxy.url(cluster.nodes[0].host_address)
    # ForceManaged refuses before connecting anywhere: no traffic leaves this machine.
    response = requests.get(
        "http://example.invalid/debian/dists/bookworm/Release",
        proxies={"http": proxy},
        timeout=10,
    )
    assert response.status_code == 403


def test_standin_repositories_are_signed_flat_repos_apt_accepts(cluster: Cluster) -> None:
    node = cluster.nodes[1]
    assert cluster.repo is not None
    base = cluster.repo.base_url(node.host_address)
    sources = (
        f"deb [signed-by=/var/tmp/gct-k8s.asc] {base}/{standin_repo.KUBERNETES_REPO}/ /\n"
        f"deb [signed-by=/var/tmp/gct-nv.asc] {base}/libnvidia-container/stable/deb/$(ARCH) /\n"
    )
    options = (
        "-o Dir::Etc::SourceList=/var/tmp/gct.list -o Dir::Etc::SourceParts=/dev/null"
        " -o Dir::State::Lists=/var/tmp/gct-lists -o Dir::Cache=/var/tmp/gct-cache"
    )
    node.run("mkdir -p /var/tmp/gct-lists/partial /var/tmp/gct-cache/archives/partial")
    (node.root / "var/tmp/gct.list").write_text(sources)
    (node.root / "var/tmp/gct-k8s.asc").write_bytes(
        requests.get(f"{base}/{standin_repo.KUBERNETES_KEY}", timeout=10).content
    )
    (node.root / "var/tmp/gct-nv.asc").write_bytes(
        requests.get(f"{base}/{standin_repo.NVIDIA_KEY}", timeout=10).content
    )
    update = node.run(f"apt-get {options} update", check=False)
    assert update.returncode == 0, update.stdout + update.stderr
    assert "NO_PUBKEY" not in update.stderr
    assert "not signed" not in update.stderr
    policy = node.run(f"apt-cache {options} madison kubeadm nvidia-container-toolkit").stdout
    for upstream in standin_repo.KUBERNETES_VERSIONS:
        assert f"{upstream}-1.1" in policy
    for upstream in standin_repo.NVIDIA_TOOLKIT_VERSIONS:
        assert f"{upstream}-1" in policy
    # A repository signed by another key is refused: the signature is really checked.
    (node.root / "var/tmp/gct-nv.asc").write_bytes((node.root / "var/tmp/gct-k8s.asc").read_bytes())
    other = standin_repo.SigningKey()
    try:
        (node.root / "var/tmp/gct-k8s.asc").write_text(other.export_armored())
    finally:
        other.close()
    refused = node.run(f"apt-get {options} update", check=False)
    assert "not signed" in refused.stderr or "NO_PUBKEY" in refused.stderr, refused.stderr
    node.run("rm -rf /var/tmp/gct.list /var/tmp/gct-*.asc /var/tmp/gct-lists /var/tmp/gct-cache")


def test_teardown_leaves_nothing_behind(tmp_path: Path) -> None:
    if missing_requirements():
        pytest.skip(missing_requirements() or "")
    with running_cluster(tmp_path / "lone", ["gct-lone"]) as lone:
        node = lone.nodes[0]
        pid = node.process.pid if node.process else -1
        veth, cgroup = node.veth, node.cgroup
    assert not Path(f"/proc/{pid}").exists()
    assert not Path(f"/sys/class/net/{veth}").exists()
    assert not Path(f"/sys/fs/cgroup/systemd/{cgroup}").exists()
    assert not Path(f"/sys/fs/cgroup/unified/{cgroup}").exists()
    assert not (tmp_path / "lone" / "gct-lone").exists()


ORPHAN_SCRIPT = """
import os, sys
from pathlib import Path
from tests.nodes.harness.cluster import Cluster
cluster = Cluster(Path(sys.argv[1]), ["gct-orphan"])
cluster.start()
node = cluster.nodes[0]
assert cluster.proxy is not None and cluster.proxy.process is not None
print(node.process.pid, node.cgroup, cluster.proxy.process.pid, cluster.proxy.cgroup, flush=True)
os._exit(0)  # dies without any teardown, like a SIGKILLed test run
"""


def test_nodes_of_a_run_that_died_are_reaped_by_the_next(tmp_path: Path) -> None:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    orphan = subprocess.run(
        [sys.executable, "-c", ORPHAN_SCRIPT, str(tmp_path / "orphan")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    nspawn_pid, node_cgroup, proxy_pid, proxy_cgroup = orphan.stdout.split()
    assert Path(f"/proc/{nspawn_pid}").exists()
    assert Path(f"/proc/{proxy_pid}").exists()
    reaped = reap_stale_nodes()
    assert set(reaped) >= {node_cgroup, proxy_cgroup}
    for pid in (nspawn_pid, proxy_pid):
        # Zombies of the dead parent are re-parented to init; gone or defunct both mean dead.
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text()
    for hierarchy in ("systemd", "unified"):
        assert not Path(f"/sys/fs/cgroup/{hierarchy}/{node_cgroup}").exists()
    shutil.rmtree(tmp_path / "orphan")
