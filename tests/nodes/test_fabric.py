"""NVSwitch systems on booted nodes: Fabric Manager at the driver's version, and the NVLink Subnet
Manager with ib_umad on a fourth-generation (HGX B200) system, checked before the join.

Two Ubuntu nodes of their own (not the session's cluster): gpu-b200-1 (Ubuntu 24.04) shows the
stand-in HGX B200 PCI bus (eight B200 GPUs, no NVSwitch bridge), gpu-h100-1 (Ubuntu 22.04) the
stand-in HGX H100 bus (eight H100 GPUs, four NVSwitch bridges) and carries a 580 driver installed
before the repository got a newer 580 release. Each run applies the nvidia_driver role, then its
check before the join (tasks/verify.yml, as kubeadm_cluster.yml does). Test doubles: the PCI buses
(tests/nodes/harness/pci.py), the stand-in CUDA repository's driver, kernel-common, Fabric Manager
and nvlsm packages (tests/nodes/harness/standin_repo.py), /run/nvidia-standin/driver-loaded for a
loaded driver and /dev/infiniband/umad0 for a loaded ib_umad (the nodes share the host's kernel,
which loads no module).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.nodes.harness import pci, standin_repo
from tests.nodes.harness.ansible_run import RunResult, run_playbook
from tests.nodes.harness.cluster import Cluster, missing_requirements, running_cluster

pytestmark = [pytest.mark.nodes, pytest.mark.slow]

B200, H100 = "gpu-b200-1", "gpu-h100-1"
SYSTEMS = {B200: "ubuntu2404", H100: "ubuntu2204"}
OLD, NEW = standin_repo.DRIVER_VERSIONS["580"]
PLAY = """
- name: Install the GPU driver, then check the host as before joining the cluster.
  hosts: gpu_nodes
  become: true
  roles:
    - role: os_support
    - role: apt_proxy
    - role: apt_prerequisites
    - role: nvidia_driver
  tasks:
    - name: Check the driver as kubeadm_cluster.yml does before the join.
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: verify.yml
"""


@dataclass
class Runs:
    cluster: Cluster
    without_umad: RunResult  # gpu-b200-1 has no ib_umad yet: it must stop before the join
    converge: RunResult
    rerun: RunResult
    # Per node after the rerun: installed versions of the driver and Fabric Manager packages, and
    # the held packages.
    versions: dict[str, dict[str, str]]
    held: dict[str, set[str]]
    upgrade: RunResult  # gpu-h100-1's driver upgraded by hand (unhold, install), then the role
    branch_590: RunResult


def _failures(run: RunResult) -> list[str]:
    return [line for line in run.output.splitlines() if line.startswith(("fatal:", "failed:"))]


PACKAGES = (
    "nvidia-headless-580-open",
    "nvidia-utils-580",
    "nvidia-fabricmanager-580",
    "nvidia-kernel-common-580-server",
)


def _versions(cluster: Cluster, name: str) -> dict[str, str]:
    listed = cluster.node(name).run(
        f"dpkg-query -W -f '${{Package}} ${{Version}}\\n' {' '.join(PACKAGES)}"
    )
    return dict(line.split() for line in listed.stdout.splitlines())


def _held(cluster: Cluster, name: str) -> set[str]:
    return set(cluster.node(name).run("apt-mark showhold").stdout.split())


def _upgrade_driver_by_hand(cluster: Cluster) -> None:
    """What the role's README says to do for a new driver release: unhold, install it."""
    packages = " ".join(
        f"{name}={NEW}-0ubuntu1"
        for name in ("nvidia-headless-580-open", "nvidia-utils-580", "nvidia-kernel-common-580")
    )
    done = cluster.node(H100).run(
        "apt-mark unhold nvidia-headless-580-open nvidia-utils-580 && "
        f"DEBIAN_FRONTEND=noninteractive apt-get -q install -y {packages}",
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _preinstall_old_driver(cluster: Cluster) -> None:
    """gpu-h100-1's driver: 580 as it was before the repository got the newer 580 release."""
    node = cluster.node(H100)
    assert cluster.repo is not None
    url = f"{cluster.repo.base_url(node.host_address)}/{standin_repo.cuda_repo(node.system)}/"
    listing = "/etc/apt/sources.list.d/standin-preinstall.list"
    apt = f"apt-get -q -o Dir::Etc::SourceList={listing} -o Dir::Etc::SourceParts=-"
    done = node.run(
        f"echo 'deb [trusted=yes] {url} /' > {listing} && {apt} update && "
        f"DEBIAN_FRONTEND=noninteractive {apt} install -y nvidia-headless-580-open={OLD}-0ubuntu1"
        f" nvidia-utils-580={OLD}-0ubuntu1 nvidia-kernel-common-580={OLD}-0ubuntu1"
        f" && rm {listing}",
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("fabric")
    with running_cluster(workdir / "nodes", list(SYSTEMS), SYSTEMS) as cluster:
        pci.install(cluster.node(B200), "hgx-b200")
        pci.install(cluster.node(H100), "hgx-h100")
        for node in cluster.nodes:
            node.run("mkdir -p /run/nvidia-standin && touch /run/nvidia-standin/driver-loaded")
        _preinstall_old_driver(cluster)
        inventory = cluster.write_inventory(
            workdir / "inventory.yml",
            {"gpu_nodes": list(SYSTEMS)},
            {"nvidia_driver_install_kernel_headers": False},
        )
        play = workdir / "play.yml"
        play.write_text(PLAY)
        without_umad = run_playbook(str(play), inventory, log=workdir / "without-umad.log")
        # What loading ib_umad at boot (/etc/modules-load.d) gives a real host, then what the
        # check's message says to do.
        cluster.node(B200).run(
            "mkdir -p /dev/infiniband && touch /dev/infiniband/umad0"
            " && systemctl restart nvidia-fabricmanager"
        )
        converge = run_playbook(str(play), inventory, log=workdir / "converge.log")
        rerun = run_playbook(str(play), inventory, log=workdir / "rerun.log")
        versions = {name: _versions(cluster, name) for name in SYSTEMS}
        held = {name: _held(cluster, name) for name in SYSTEMS}
        _upgrade_driver_by_hand(cluster)
        upgrade = run_playbook(str(play), inventory, "--limit", H100, log=workdir / "upgrade.log")
        branch_590 = run_playbook(
            str(play),
            inventory,
            "--limit",
            H100,
            "-e",
            "nvidia_driver_branch=590",
            log=workdir / "branch-590.log",
        )
        yield Runs(cluster, without_umad, converge, rerun, versions, held, upgrade, branch_590)


def test_a_b200_without_ib_umad_stops_before_the_join_with_one_line(runs: Runs) -> None:
    run = runs.without_umad
    failures = _failures(run)
    assert len(failures) == 1, run.describe()
    assert B200 in failures[0]
    assert f"The ib_umad kernel module is not loaded on {B200}" in failures[0]
    assert runs.without_umad.recap[H100]["failed"] == 0, run.describe()


def test_a_b200_gets_fabric_manager_nvlsm_and_ib_umad(runs: Runs) -> None:
    assert runs.converge.returncode == 0, runs.converge.describe()
    node = runs.cluster.node(B200)
    installed = node.run(
        "dpkg-query -W -f '${Package} ${Version}\\n' nvlsm 'nvidia-fabricmanager-*'"
    )
    assert f"nvidia-fabricmanager-580 {NEW}-1" in installed.stdout
    assert f"nvlsm {standin_repo.NVLSM_VERSION}" in installed.stdout
    assert "ib_umad" in node.read("/etc/modules-load.d/ib_umad.conf").split()
    assert node.run("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
    # Fabric Manager's service started the subnet manager, with its packaged configuration.
    assert node.run("pgrep -x nvlsm", check=False).returncode == 0
    calls = node.read("/var/lib/nvidia-standin/calls.log")
    assert "nvlsm -F /usr/share/nvidia/nvlsm/nvlsm.conf" in calls


def test_an_h100_gets_fabric_manager_without_nvlsm(runs: Runs) -> None:
    node = runs.cluster.node(H100)
    assert node.run("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
    nvlsm = node.run("dpkg-query -W -f '${Status}' nvlsm", check=False)
    assert "install ok installed" not in nvlsm.stdout
    assert node.run("test -e /etc/modules-load.d/ib_umad.conf", check=False).returncode != 0
    assert node.run("pgrep -x nvlsm", check=False).returncode != 0


@pytest.mark.parametrize(("name", "upstream"), [(H100, OLD), (B200, NEW)])
def test_fabric_manager_is_at_the_drivers_version_and_both_are_held(
    runs: Runs, name: str, upstream: str
) -> None:
    assert runs.versions[name] == {
        "nvidia-headless-580-open": f"{upstream}-0ubuntu1",
        "nvidia-utils-580": f"{upstream}-0ubuntu1",
        "nvidia-fabricmanager-580": f"{upstream}-1",
        "nvidia-kernel-common-580-server": f"{upstream}-0ubuntu1",
    }
    held = {"nvidia-headless-580-open", "nvidia-utils-580", "nvidia-fabricmanager-580"}
    assert held <= runs.held[name]
    node = runs.cluster.node(name)
    # The repository's newest Fabric Manager is another one on the older host.
    offered = node.run("apt-cache madison nvidia-fabricmanager-580").stdout
    assert f"{NEW}-1" in offered
    assert f"{OLD}-1" in offered
    # The preference for the driver's release lasts only while Fabric Manager is installed.
    assert not (node.root / "etc/apt/preferences.d/nvidia-driver-release").exists()


def test_fabric_manager_follows_an_upgraded_driver_and_both_are_held_again(runs: Runs) -> None:
    run = runs.upgrade
    assert run.returncode == 0, run.describe()
    assert run.recap[H100]["changed"] > 0, run.describe()
    assert _versions(runs.cluster, H100) == {
        "nvidia-headless-580-open": f"{NEW}-0ubuntu1",
        "nvidia-utils-580": f"{NEW}-0ubuntu1",
        "nvidia-fabricmanager-580": f"{NEW}-1",
        "nvidia-kernel-common-580-server": f"{NEW}-0ubuntu1",
    }
    held = {"nvidia-headless-580-open", "nvidia-utils-580", "nvidia-fabricmanager-580"}
    assert held <= _held(runs.cluster, H100)


def test_a_rerun_changes_nothing(runs: Runs) -> None:
    run = runs.rerun
    assert run.returncode == 0, run.describe()
    assert set(run.recap) == set(SYSTEMS)
    assert run.total("changed") == 0, run.describe()


def test_a_590_branch_is_refused_with_one_line_naming_the_variable(runs: Runs) -> None:
    run = runs.branch_590
    assert run.returncode != 0
    failures = _failures(run)
    assert len(failures) == 1, run.describe()
    # Ansible's JSON escapes the quotes around the value.
    assert 'nvidia_driver_branch is \\"590\\"' in failures[0], failures[0]
    assert "nvidia-driver-pinning-590" in failures[0]
    assert "\\n" not in failures[0]
    # Refused before anything changed.
    assert run.recap[H100]["changed"] == 0, run.describe()
