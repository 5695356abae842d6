"""The playbook runs: check mode, failure half-way and rerun, idempotence, unsupported OS.

The runs happen once per session (tests/nodes/harness/provision.py) against three booted nodes,
all GPU nodes: gpu-cp-1 (control plane, Debian 12), gpu-worker-1 (Ubuntu 22.04) and gpu-worker-2
(Ubuntu 24.04), the Ubuntu ones being the Debian userland with Ubuntu's os-release. Test doubles:
the stand-in vendor packages (NVIDIA CUDA drivers, NVIDIA container toolkit, Docker CE, Kubernetes)
served from local signed repositories; the stand-in kubeadm fails one init on request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodes.harness.ansible_run import run_playbook
from tests.nodes.harness.cluster import DEFAULT_NODE_NAMES, Cluster
from tests.nodes.harness.provision import CONTROL_PLANE, WORKERS, Provisioned, inventory_for

pytestmark = [pytest.mark.nodes, pytest.mark.slow]


@contextlib.contextmanager
def _replaced_files(root: Path, contents: dict[str, str]) -> Iterator[None]:
    """Replace files (or symlinks) under a node's root for the duration of the block."""
    saved: dict[Path, tuple[Path | None, bytes]] = {}
    for relative, text in contents.items():
        path = root / relative
        saved[path] = (path.readlink() if path.is_symlink() else None, path.read_bytes())
        path.unlink()
        path.write_text(text)
    try:
        yield
    finally:
        for path, (link, data) in saved.items():
            path.unlink()
            if link is not None:
                path.symlink_to(link)
            else:
                path.write_bytes(data)


def test_check_run_on_fresh_nodes_is_clean(provisioned: Provisioned) -> None:
    run = provisioned.check_run
    assert run.returncode == 0, run.describe()
    assert sorted(run.recap) == sorted(DEFAULT_NODE_NAMES)
    assert run.total("failed") == 0
    assert run.total("unreachable") == 0


def test_run_with_vendor_repositories_down_fails_half_way(provisioned: Provisioned) -> None:
    run = provisioned.interrupted_run
    assert run.returncode != 0, run.describe()
    for host in DEFAULT_NODE_NAMES:
        assert run.recap[host]["failed"] == 1, run.describe()
        # It failed after real work (the proxy file; on Debian the whole driver; on Ubuntu the pin).
        assert run.recap[host]["changed"] > 0, run.describe()
    assert "Could not fetch signed_by key" in run.output


def test_gpu_hosts_whose_driver_is_not_loaded_stop_before_joining(
    provisioned: Provisioned,
) -> None:
    """After a fresh driver install without a reboot (the module cannot be
    loaded here: these nodes' kernel loads no modules), neither GPU worker joins, and each stops
    with one message saying what to do."""
    run = provisioned.unloaded_run
    assert run.returncode != 0, run.describe()
    failures = [line for line in run.output.splitlines() if line.startswith(("fatal:", "failed:"))]
    assert len(failures) == len(WORKERS), run.describe()
    for host in WORKERS:
        assert run.recap[host]["failed"] == 1, run.describe()
        (line,) = [f for f in failures if f"[{host}]" in f]
        assert f"NVIDIA driver not loaded on {host}" in line
        assert "couldn't communicate with the NVIDIA driver" in line
        assert "so it does not join the cluster" in line
        assert "Reboot it" in line
        assert "\\n" not in line  # one line: no newline escaped in Ansible's JSON
    assert "Join the cluster with kubeadm." not in run.output
    assert "could not be loaded without a reboot" in run.output  # the install's own report


def test_an_nvswitch_host_without_fabric_manager_stops_before_joining(
    provisioned: Provisioned,
) -> None:
    run = provisioned.fabric_mismatch_run
    assert run.returncode != 0, run.describe()
    failures = [line for line in run.output.splitlines() if line.startswith(("fatal:", "failed:"))]
    assert len(failures) == 1, run.describe()
    assert "NVIDIA Fabric Manager is not active on gpu-worker-2, an NVSwitch system" in failures[0]
    assert "systemctl status" in failures[0]
    assert "nvidia-fabricmanager" in failures[0]
    assert "kubeadm" not in failures[0]


def test_a_failed_kubeadm_init_stops_the_run_with_kubeadms_error_and_no_token(
    provisioned: Provisioned,
) -> None:
    run = provisioned.failed_init_run
    assert run.returncode != 0, run.describe()
    assert run.recap[CONTROL_PLANE[0]]["failed"] == 1, run.describe()
    failures = [line for line in run.output.splitlines() if line.startswith(("fatal:", "failed:"))]
    assert len(failures) == 1, run.describe()
    assert "kubeadm init failed (exit 1)" in failures[0]
    assert "error execution phase addon/coredns" in failures[0]
    assert "token <token> was issued" in failures[0]
    token = provisioned.cluster.node(CONTROL_PLANE[0]).read(
        "/var/lib/kubeadm-standin/failed-init-token"
    )
    assert token
    assert token not in run.output
    # Nothing joins a control plane that failed: the run ends there.
    assert "TASK [kubeadm_worker" not in run.output, run.describe()


def test_rerun_after_the_failure_converges(provisioned: Provisioned) -> None:
    run = provisioned.converge_run
    assert run.returncode == 0, run.describe()
    assert sorted(run.recap) == sorted(DEFAULT_NODE_NAMES)
    assert run.total("failed") == 0
    assert run.total("unreachable") == 0
    assert run.total("changed") > 0


def test_second_run_changes_nothing(provisioned: Provisioned) -> None:
    run = provisioned.rerun
    assert run.returncode == 0, run.describe()
    for host in DEFAULT_NODE_NAMES:
        assert run.recap[host]["changed"] == 0, run.describe()
        assert run.recap[host]["failed"] == 0


def test_no_bootstrap_token_reaches_the_ansible_output(provisioned: Provisioned) -> None:
    worker = provisioned.cluster.node(WORKERS[0])
    join = worker.read("/var/lib/kubeadm-standin/join-config.yaml")
    token = next(line.split(":", 1)[1].strip() for line in join.splitlines() if "token:" in line)
    assert token
    for run in (provisioned.converge_run, provisioned.rerun):
        assert token not in run.output


def _runs_of_task(output: str, task: str) -> int:
    """How many times the task ran on some host (its header shows even when every host skipped)."""
    blocks = output.split("\nTASK [")[1:]
    return sum(
        1
        for block in blocks
        if block.startswith(task)
        and any(line.startswith(("ok:", "changed:")) for line in block.splitlines())
    )


def test_site_sets_up_a_gpu_nodes_runtime_once_per_run(provisioned: Provisioned) -> None:
    # kubeadm_cluster.yml skips the roles gpu_nodes.yml ran on the same host in the same run.
    for run in (provisioned.converge_run, provisioned.rerun):
        for task in (
            "container_runtime : Install containerd and Docker.]",
            "apt_prerequisites : Install the Python libraries Ansible's apt modules need.]",
            "apt_proxy : Configure apt's proxy.]",
        ):
            assert _runs_of_task(run.output, task) == 1, (task, run.describe())
        assert _runs_of_task(run.output, "kubernetes_node : Install the Kubernetes packages") == 1


@pytest.mark.parametrize(
    ("distribution", "version_id", "codename"),
    [("debian", "11", "bullseye"), ("ubuntu", "20.04", "focal")],
)
def test_unsupported_operating_system_fails_at_the_start_with_one_clear_message(
    cluster: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
    distribution: str,
    version_id: str,
    codename: str,
) -> None:
    """Needs no provisioning: it must fail before changing anything, on a fresh node too."""
    node = cluster.node(CONTROL_PLANE[0])
    name = "Debian GNU/Linux" if distribution == "debian" else "Ubuntu"
    fake = {
        "etc/os-release": (
            f'NAME="{name}"\nID={distribution}\nVERSION_ID="{version_id}"\n'
            f"VERSION_CODENAME={codename}\n"
        ),
    }
    if distribution == "debian":
        # Ansible reads Debian's point release from /etc/debian_version, not from os-release.
        fake["etc/debian_version"] = f"{version_id}.9\n"
    with _replaced_files(node.root, fake):
        inventory = inventory_for(
            cluster, tmp_path_factory.mktemp("unsupported") / "inventory.yml", [node.name]
        )
        run = run_playbook("site.yml", inventory)
    assert run.returncode != 0, run.describe()
    assert run.recap[node.name]["failed"] == 1, run.describe()
    assert run.recap[node.name]["changed"] == 0, run.describe()
    failures = [line for line in run.output.splitlines() if line.startswith(("fatal:", "failed:"))]
    assert len(failures) == 1, run.describe()
    label = "Debian" if distribution == "debian" else "Ubuntu"
    assert f"Unsupported operating system {label} {version_id}" in failures[0]
    assert "Debian 12, Ubuntu 22.04, Ubuntu 24.04" in failures[0]


def test_apt_proxy_removes_only_the_file_it_wrote(provisioned: Provisioned, tmp_path: Path) -> None:
    node = provisioned.cluster.node(CONTROL_PLANE[0])
    confd = node.root / "etc/apt/apt.conf.d"
    foreign = confd / "01proxy"
    foreign.write_text('// Someone else\'s file.\nAcquire::Retries "3";\n')
    own = confd / "01gpu-cluster-apt-proxy"
    assert own.exists()
    playbook = tmp_path / "apt-proxy.yml"
    playbook.write_text(
        f"- name: Apt proxy only.\n  hosts: {node.name}\n  roles:\n    - role: apt_proxy\n"
    )
    try:
        removed = run_playbook(str(playbook), provisioned.inventory, "-e", '{"apt_proxy_url": ""}')
        assert removed.returncode == 0, removed.describe()
        assert removed.recap[node.name]["changed"] == 1, removed.describe()
        assert not own.exists()
        assert foreign.read_text().startswith("// Someone else's file.")
    finally:
        restored = run_playbook(str(playbook), provisioned.inventory)
        foreign.unlink()
    assert restored.returncode == 0, restored.describe()
    assert own.exists()
