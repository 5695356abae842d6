"""The nvidia_mig role on the booted test nodes, against a stand-in nvidia-mig-parted.

Test doubles (tests/nodes/README.md): NVIDIA's nvidia-mig-manager package is a stand-in built like
the other vendor packages and served where GitHub would serve the release; its nvidia-mig-parted
takes the real command line and config format and models the GPUs (a JSON file per node says
which), their MIG state, and a GPU in use (a process holding its stand-in device open). GPU
clients are stand-ins too: a DCGM service and a device plugin container (the stand-in crictl)
that hold GPUs open. Real: Ansible, the role, systemd, the nodes.

One module-scoped sequence on the three nodes, each with its own hardware and layout:
gpu-cp-1 (one H100 80GB, all-balanced), gpu-worker-1 (two A100 80GB, all-1g.10gb, with the GPU
clients running), gpu-worker-2 (one A100 40GB, all-1g.10gb: four instances there). A check run
first, then converge, rerun, a check run again, a GPU held by a workload, a reboot's loss of the
GPU instances, and the node checks of checks/test_mig.py. The nodes are put back as they were at
the end (no layout, no package), for the other node tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.nodes.harness.ansible_run import RunResult, run_playbook
from tests.nodes.harness.cluster import Cluster
from tests.nodes.harness.machine import Node
from tests.nodes.harness.provision import Provisioned, inventory_for
from tests.nodes.harness.standin_repo import PAYLOADS, mig_manager_release

pytestmark = [pytest.mark.nodes, pytest.mark.slow]
REPO_ROOT = Path(__file__).resolve().parents[2]

H100 = {"name": "NVIDIA H100 80GB HBM3", "device_id": "0x233010DE", "mig_capable": True}
A100_80GB = {"name": "NVIDIA A100-SXM4-80GB", "device_id": "0x20B210DE", "mig_capable": True}
A100_40GB = {"name": "NVIDIA A100-SXM4-40GB", "device_id": "0x20B010DE", "mig_capable": True}
HARDWARE = {"gpu-cp-1": [H100], "gpu-worker-1": [A100_80GB, A100_80GB], "gpu-worker-2": [A100_40GB]}
LAYOUTS = {"gpu-cp-1": "all-balanced", "gpu-worker-1": "all-1g.10gb", "gpu-worker-2": "all-1g.10gb"}
# What nvidia-mig-parted export shows once each layout is applied.
EXPECTED = {
    "gpu-cp-1": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "gpu-worker-1": {"1g.10gb": 7},
    "gpu-worker-2": {"1g.10gb": 4},
}
CLIENTS_NODE = "gpu-worker-1"
BUSY_NODE = "gpu-worker-2"
DEVICE_PLUGIN_CONTAINER = "3f5c0d1e9a7b"
STANDIN_LOG = "/var/log/nvidia-mig-parted-standin.log"
DEVICE_DIR = "/run/nvidia-mig-parted-standin"
DCGM_UNIT = """\
[Unit]
Description=Stand-in NVIDIA DCGM host engine (test double: holds the GPUs open)

[Service]
ExecStart=/usr/local/bin/gpu-client 0 1

[Install]
WantedBy=multi-user.target
"""


@dataclass
class MigRuns:
    cluster: Cluster
    inventory: Path
    check_run: RunResult
    installed_by_check: list[str]
    converge_run: RunResult
    rerun: RunResult
    second_check_run: RunResult
    busy_run: RunResult
    exported: dict[str, Any]
    crictl_calls: str
    no_crictl_run: RunResult  # a change on a node with a kubelet and no crictl


def export(node: Node) -> dict[str, Any]:
    return dict(yaml.safe_load(node.run("nvidia-mig-parted export").stdout))


def devices(exported: dict[str, Any]) -> list[dict[str, int]]:
    return [entry["mig-devices"] for entry in exported["mig-configs"]["current"]]


def install_gpu_client(node: Node) -> None:
    """The stand-in GPU client (tests/nodes/standin/gpu-client) as /usr/local/bin/gpu-client."""
    (node.root / "usr/local/bin/gpu-client").write_text((PAYLOADS / "gpu-client").read_text())
    node.run("chmod 0755 /usr/local/bin/gpu-client")


def start_gpu_clients(node: Node) -> None:
    """A DCGM service holding both GPUs, and a device plugin container (its process a transient
    unit) holding GPU 0, listed by the stand-in crictl; the kubelet runs already."""
    install_gpu_client(node)
    (node.root / "etc/systemd/system/nvidia-dcgm.service").write_text(DCGM_UNIT)
    node.run("systemctl daemon-reload && systemctl enable --now nvidia-dcgm.service")
    node.run("systemd-run --unit=standin-device-plugin /usr/local/bin/gpu-client 0")
    pid = node.run("systemctl show --property=MainPID --value standin-device-plugin").stdout
    state = node.root / "var/lib/crictl-standin"
    state.mkdir(parents=True, exist_ok=True)
    image = "sha256:9e4b0f0c1d2e"
    (state / "images.json").write_text(
        json.dumps([{"id": image, "repoTags": ["nvcr.io/nvidia/k8s-device-plugin:v0.20.0"]}])
    )
    container = {
        "id": DEVICE_PLUGIN_CONTAINER,
        "image": {"image": image},
        "state": "CONTAINER_RUNNING",
        "pid": int(pid),
    }
    other = {"id": "7a7a7a7a", "image": {"image": "sha256:0000"}, "state": "CONTAINER_RUNNING"}
    (state / "containers.json").write_text(json.dumps([container, other]))


def add_gpus(node: Node) -> None:
    """The node's stand-in GPUs: the hardware list nvidia-mig-parted reads, and the device files
    (the stand-ins of /dev/nvidia<i>, which the driver creates) that GPU clients hold open."""
    hardware = node.root / "etc/nvidia-mig-parted-standin/gpus.json"
    hardware.parent.mkdir(parents=True, exist_ok=True)
    hardware.write_text(json.dumps(HARDWARE[node.name]))
    files = " ".join(f"nvidia{index}" for index in range(len(HARDWARE[node.name])))
    node.run(f"mkdir -p {DEVICE_DIR} && cd {DEVICE_DIR} && touch {files}")


def kubelet_active(node: Node) -> bool:
    return node.run("systemctl is-active kubelet.service", check=False).stdout.strip() == "active"


def restore(node: Node, kubelet_was_active: bool) -> None:
    """Back to a node without MIG tooling, as provisioning left it."""
    node.run(
        "systemctl disable --now nvidia-dcgm.service gpu-cluster-mig-layout.service; "
        "systemctl stop standin-device-plugin standin-workload; "
        "systemctl reset-failed standin-device-plugin standin-workload; "
        "rm -f /etc/systemd/system/nvidia-dcgm.service /etc/systemd/system/"
        "gpu-cluster-mig-layout.service; systemctl daemon-reload; "
        "dpkg --purge nvidia-mig-manager; "
        "rm -rf /etc/gpu-cluster /var/cache/gpu-cluster /etc/nvidia-mig-parted-standin "
        "/var/lib/nvidia-mig-parted-standin "
        "/var/lib/crictl-standin /run/nvidia-mig-parted-standin; "
        f"systemctl {'start' if kubelet_was_active else 'stop'} kubelet",
        check=False,
    )


@pytest.fixture(scope="module")
def mig(provisioned: Provisioned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigRuns]:
    cluster = provisioned.cluster
    workdir = tmp_path_factory.mktemp("mig")
    assert cluster.repo is not None
    # The stand-in kubeadm does not start the kubelet, as the real one does on init and join.
    kubelet_was_active = {node.name: kubelet_active(node) for node in cluster.nodes}
    for node in cluster.nodes:
        add_gpus(node)
        node.run("systemctl start kubelet.service")
    inventory = inventory_for(cluster, workdir / "inventory.yml")
    document = yaml.safe_load(inventory.read_text())
    for node in cluster.nodes:
        document["all"]["hosts"][node.name] |= {
            "nvidia_mig_config": LAYOUTS[node.name],
            "nvidia_mig_parted_package_url": (
                f"{cluster.repo.base_url(node.host_address)}/{mig_manager_release()}"
            ),
        }
    inventory.write_text(yaml.safe_dump(document))
    try:
        check_run = run_playbook("mig.yml", inventory, "--check", log=workdir / "check.log")
        installed_by_check = [
            node.name
            for node in cluster.nodes
            if node.run("dpkg -s nvidia-mig-manager", check=False).returncode == 0
            or (node.root / "etc/gpu-cluster").exists()
            or (node.root / "var/cache/gpu-cluster").exists()
            or (node.root / "var/lib/nvidia-mig-parted-standin").exists()
        ]
        start_gpu_clients(cluster.node(CLIENTS_NODE))
        converge_run = run_playbook("mig.yml", inventory, log=workdir / "converge.log")
        rerun = run_playbook("mig.yml", inventory, log=workdir / "rerun.log")
        second_check_run = run_playbook("mig.yml", inventory, "--check", log=workdir / "check2.log")
        exported = {node.name: export(node) for node in cluster.nodes}
        calls = cluster.node(CLIENTS_NODE).read("/var/lib/nvidia-standin/calls.log")
        busy = cluster.node(BUSY_NODE)
        install_gpu_client(busy)
        busy.run("systemd-run --unit=standin-workload /usr/local/bin/gpu-client 0")
        busy_run = run_playbook(
            "mig.yml",
            inventory,
            "--limit",
            BUSY_NODE,
            "-e",
            "nvidia_mig_config=all-disabled",
            log=workdir / "busy.log",
        )
        busy.run("systemctl stop standin-workload")
        busy.run("mv /usr/bin/crictl /usr/bin/crictl.away")
        try:
            no_crictl_run = run_playbook(
                "mig.yml",
                inventory,
                "--limit",
                BUSY_NODE,
                "-e",
                "nvidia_mig_config=all-disabled",
                log=workdir / "no-crictl.log",
            )
        finally:
            busy.run("mv /usr/bin/crictl.away /usr/bin/crictl")
        yield MigRuns(
            cluster,
            inventory,
            check_run,
            installed_by_check,
            converge_run,
            rerun,
            second_check_run,
            busy_run,
            exported,
            calls,
            no_crictl_run,
        )
    finally:
        for node in cluster.nodes:
            restore(node, kubelet_was_active[node.name])


def test_a_check_run_on_fresh_nodes_changes_nothing_and_says_what_it_would(mig: MigRuns) -> None:
    run = mig.check_run
    assert run.returncode == 0, run.describe()
    assert run.total("failed") == 0
    for host in LAYOUTS:
        assert run.recap[host]["changed"] > 0, run.describe()
    reports = re.findall(
        r"MIG configuration (\S+) is not applied; a real run applies it", run.output
    )
    assert sorted(reports) == sorted(LAYOUTS.values())
    assert mig.installed_by_check == []  # no package, no configuration, no MIG state


def test_converge_applies_each_hosts_layout(mig: MigRuns) -> None:
    run = mig.converge_run
    assert run.returncode == 0, run.describe()
    for host, expected in EXPECTED.items():
        assert devices(mig.exported[host]) == [expected], (host, mig.exported[host])
        assert run.recap[host]["changed"] > 0


def test_the_gpu_clients_let_go_during_the_change_and_run_again_after(mig: MigRuns) -> None:
    node = mig.cluster.node(CLIENTS_NODE)
    applies = [
        json.loads(line)
        for line in node.read(STANDIN_LOG).splitlines()
        if json.loads(line)["argv"][:1] == ["apply"]
    ]
    assert applies
    assert applies[0]["outcome"] == "ok"
    assert applies[0]["holders"] == []  # DCGM and the device plugin had let go
    for unit in ("nvidia-dcgm.service", "kubelet.service"):
        assert node.run(f"systemctl is-active {unit}").stdout.strip() == "active", unit
    # The device plugin's container was stopped through the CRI (the kubelet restarts it); the
    # container of another image was left alone.
    stops = [line for line in mig.crictl_calls.splitlines() if " stop " in f"{line} "]
    assert stops == [
        f"crictl --runtime-endpoint unix:///run/containerd/containerd.sock stop "
        f"{DEVICE_PLUGIN_CONTAINER}"
    ]
    # The kubelet stopped first (so it restarts nothing), started last.
    assert task_items(mig.converge_run.output, "Stop the GPU clients.", CLIENTS_NODE) == [
        "kubelet.service",
        "nvidia-dcgm.service",
    ]
    assert task_items(mig.converge_run.output, "Start the GPU clients again.", CLIENTS_NODE) == [
        "nvidia-dcgm.service",
        "kubelet.service",
    ]


def task_items(output: str, task: str, host: str) -> list[str]:
    """The loop items a task reported for a host, in order."""
    block = output.split(f"TASK [nvidia_mig : {task}]", 1)[1].split("TASK [", 1)[0]
    return re.findall(rf"^\w+: \[{re.escape(host)}\] => \(item=(\S+)\)$", block, re.MULTILINE)


def test_a_second_run_and_a_check_run_change_nothing(mig: MigRuns) -> None:
    for run in (mig.rerun, mig.second_check_run):
        assert run.returncode == 0, run.describe()
        assert run.total("changed") == 0, run.describe()


def test_a_gpu_in_use_stops_the_run_with_the_reason_and_the_clients_come_back(
    mig: MigRuns,
) -> None:
    run = mig.busy_run
    node = mig.cluster.node(BUSY_NODE)
    assert run.returncode != 0, run.describe()
    assert run.recap[BUSY_NODE]["failed"] == 1, run.describe()
    failure = next(line for line in run.output.splitlines() if line.startswith("fatal:"))
    assert "could not apply MIG configuration all-disabled" in failure
    assert "In use by another client" in failure
    assert "kubectl drain" in failure
    assert devices(export(node)) == [EXPECTED[BUSY_NODE]]  # nothing changed
    assert node.run("systemctl is-active kubelet.service").stdout.strip() == "active"


def test_without_crictl_a_node_with_a_kubelet_stops_before_stopping_anything(
    mig: MigRuns,
) -> None:
    """kubeadm has not depended on cri-tools since 1.32: where crictl is missing, the pods holding
    the GPUs cannot be stopped, so the role says so instead of failing half-way."""
    run = mig.no_crictl_run
    node = mig.cluster.node(BUSY_NODE)
    assert run.returncode != 0, run.describe()
    failure = next(line for line in run.output.splitlines() if line.startswith("fatal:"))
    assert "/usr/bin/crictl (nvidia_mig_crictl_path) is missing" in failure
    assert "Install cri-tools" in failure
    assert "TASK [nvidia_mig : Stop the GPU clients.]" not in run.output
    assert devices(export(node)) == [EXPECTED[BUSY_NODE]]  # nothing changed
    assert node.run("systemctl is-active kubelet.service").stdout.strip() == "active"


def test_the_boot_unit_applies_the_layout_again_after_a_reboot(mig: MigRuns) -> None:
    """A reboot keeps the MIG mode and loses the GPU instances (the stand-in's power-cycle);
    the boot unit, ordered before the GPU clients, applies the layout again."""
    node = mig.cluster.node(CLIENTS_NODE)
    config = "/etc/gpu-cluster/mig/config.yaml"
    node.run("nvidia-mig-parted power-cycle")
    lost = node.run(f"nvidia-mig-parted assert -f {config} -c {LAYOUTS[CLIENTS_NODE]}", check=False)
    assert lost.returncode == 1
    assert "Assertion failure" in lost.stderr
    node.run("systemctl stop nvidia-dcgm.service kubelet.service")  # as at boot: not started yet
    node.run("systemctl restart gpu-cluster-mig-layout.service")
    node.run(f"nvidia-mig-parted assert -f {config} -c {LAYOUTS[CLIENTS_NODE]}")
    node.run("systemctl start nvidia-dcgm.service kubelet.service")
    before = node.run("systemctl show --property=Before --value gpu-cluster-mig-layout.service")
    assert {"kubelet.service", "containerd.service", "nvidia-dcgm.service"} <= set(
        before.stdout.split()
    )
    assert node.run(
        "systemctl is-enabled nvidia-mig-manager.service", check=False
    ).stdout.strip() == ("disabled")


def test_the_node_checks_verify_the_layouts(mig: MigRuns) -> None:
    cluster = mig.cluster
    hosts = ",".join(f"ssh://root@{node.address}" for node in cluster.nodes)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/nodes/checks/test_mig.py",
            f"--hosts={hosts}",
            f"--ssh-identity-file={cluster.ssh_key}",
            f"--ssh-extra-args=-o UserKnownHostsFile={cluster.known_hosts}"
            " -o StrictHostKeyChecking=yes",
            "-p",
            "no:cacheprovider",
            "-v",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert output.count("test_the_mig_layout_is_applied_and_reapplied_at_boot") >= 3
    assert re.search(r"3 passed, 3 skipped", output), output[-2000:]
