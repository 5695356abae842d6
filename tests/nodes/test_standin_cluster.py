"""Checks that need the test harness: they read what the stand-in packages recorded.

Test doubles: stand-in nvidia-container-runtime (logs each call, decides which stand-in GPUs a
container gets from the real OCI spec and the real toolkit configuration, then runs runc),
stand-in kubeadm (records its arguments and the config file it was given, writes the files real
kubeadm writes, fails one init on request), stand-in kubectl (records applies, answers /readyz),
stand-in CUDA driver, Fabric Manager and Docker CE packages on the Ubuntu nodes (Docker CE's depend
on Debian's real docker.io and containerd). On Debian the NVIDIA driver is Debian's real non-free
package (no GPU).
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.gpu import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
)
from tests.nodes.harness.cluster import DEFAULT_NODE_NAMES, DEFAULT_NODES
from tests.nodes.harness.machine import Node
from tests.nodes.harness.provision import (
    CONTROL_PLANE,
    HALF_JOINED_KUBELET_CONF,
    HALF_JOINED_WORKER,
    NODE_VARS,
    WORKERS,
    Provisioned,
)
from tests.nodes.harness.standin_repo import PAYLOADS

pytestmark = [pytest.mark.nodes, pytest.mark.slow]
RUNTIME_LOG = "/var/log/nvidia-container-runtime-standin.log"
DEBIAN_NODES = [name for name, system in DEFAULT_NODES.items() if system == "debian12"]
UBUNTU_NODES = [name for name, system in DEFAULT_NODES.items() if system != "debian12"]
# Every test node is in gpu_nodes: kubeadm must register each with what infra/gpu.py selects.
GPU_LABELS_ARG = {"name": "node-labels", "value": f"{GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}"}
GPU_TAINT = {"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}


def _calls(node: Node, path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in node.read(path).splitlines()]


@pytest.fixture(scope="module")
def control_plane(provisioned: Provisioned) -> Node:
    return provisioned.cluster.node(CONTROL_PLANE[0])


@pytest.fixture(scope="module")
def worker(provisioned: Provisioned) -> Node:
    return provisioned.cluster.node(WORKERS[0])


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_docker_run_goes_through_the_nvidia_runtime(provisioned: Provisioned, name: str) -> None:
    node = provisioned.cluster.node(name)
    before = node.run(f"cat {RUNTIME_LOG} 2>/dev/null || true").stdout.splitlines()
    ran = node.run(f"docker run --rm {provisioned.image} echo through-nvidia", check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "through-nvidia"
    after = node.run(f"cat {RUNTIME_LOG}").stdout.splitlines()
    new = after[len(before) :]
    assert any(" create " in f" {line} " and "--bundle" in line for line in new), new
    assert any(" start " in f" {line} " for line in new), new


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_kubernetes_is_pinned_below_the_newest_version_available(
    provisioned: Provisioned, name: str
) -> None:
    node = provisioned.cluster.node(name)
    for package in ("kubelet", "kubeadm", "kubectl"):
        installed = node.run(f"dpkg-query -W -f '${{Version}}' {package}").stdout
        available = node.run(f"apt-cache madison {package}").stdout
        assert installed == "1.35.9-1.1"
        assert "1.35.10-1.1" in available


@pytest.mark.parametrize("name", DEBIAN_NODES)
def test_the_real_debian_driver_is_installed_headless_with_open_modules_and_finds_no_gpu(
    provisioned: Provisioned, name: str
) -> None:
    node = provisioned.cluster.node(name)
    version = node.run("dpkg-query -W -f '${Version}' libcuda1").stdout
    assert version.startswith("535."), version
    # The default flavour for 535: the open modules (contrib), at exactly the driver's version, and
    # so is all userspace of the driver's source, dependencies included.
    module = node.run("dpkg-query -W -f '${Version}' nvidia-open-kernel-dkms").stdout
    assert module == version
    from_driver_source = node.run(
        "dpkg-query -W -f '${source:Package} ${Version}\\n' | grep '^nvidia-graphics-drivers '"
    ).stdout.splitlines()
    assert len(from_driver_source) >= 8, from_driver_source
    assert {line.split()[1] for line in from_driver_source} == {version}
    for package in ("nvidia-smi", "libnvidia-ml1", "firmware-nvidia-gsp", "nvidia-persistenced"):
        status = node.run(f"dpkg-query -W -f '${{Status}}' {package}").stdout
        assert status == "install ok installed", (package, status)
    # Headless: neither Debian's nvidia-driver metapackage nor the X server and GL stack it pulls.
    for package in ("nvidia-driver", "xserver-xorg-core", "libgl1-mesa-dri", "nvidia-kernel-dkms"):
        status = node.run(f"dpkg-query -W -f '${{Status}}' {package} 2>/dev/null || true").stdout
        assert "ok installed" not in status, package
    sources = node.run("cat /etc/apt/sources.list.d/debian-non-free.sources").stdout
    assert "non-free" in sources
    security = node.run("cat /etc/apt/sources.list.d/debian-security-non-free.sources").stdout
    assert "Suites: bookworm-security" in security
    assert "non-free-firmware" in security
    # apt reads the security suite's lists, and the pin holds the driver at the module's version.
    policy = node.run("apt-cache policy libcuda1").stdout
    assert "bookworm-security/non-free" in policy, policy
    assert f"*** {version} 990" in policy, policy
    smi = node.run("nvidia-smi -L", check=False)
    assert smi.returncode != 0
    assert "NVIDIA" in smi.stdout + smi.stderr


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_no_unit_failed_but_the_persistence_daemon_which_needs_a_gpu(
    provisioned: Provisioned, name: str
) -> None:
    node = provisioned.cluster.node(name)
    failed = node.run("systemctl list-units --failed --plain --no-legend").stdout.split("\n")
    units = {line.split()[0] for line in failed if line.strip()}
    assert units <= {"nvidia-persistenced.service"}, failed


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_apt_prerequisites_came_without_recommends(provisioned: Provisioned, name: str) -> None:
    node = provisioned.cluster.node(name)
    for package, wanted in (("python3-apt", True), ("python3-debian", True), ("iso-codes", False)):
        status = node.run(f"dpkg-query -W -f '${{Status}}' {package} 2>/dev/null || true").stdout
        assert ("ok installed" in status) is wanted, (package, status)


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_debian_packages_came_through_the_apt_proxy(provisioned: Provisioned, name: str) -> None:
    node = provisioned.cluster.node(name)
    proxy = provisioned.cluster.proxy
    assert proxy is not None
    assert proxy.url(node.host_address) in node.read("/etc/apt/apt.conf.d/01gpu-cluster-apt-proxy")
    log = (proxy.workdir / "log" / "apt-cacher.log").read_text()
    for package in ("libcuda1_", "docker.io_", "containerd_"):
        assert package in log


@pytest.mark.parametrize(
    ("name", "flavour", "packages"),
    [
        ("gpu-worker-1", "open", ["nvidia-headless-580-open", "nvidia-utils-580"]),
        ("gpu-worker-2", "proprietary", ["nvidia-headless-580", "nvidia-utils-580"]),
    ],
)
def test_ubuntu_gets_the_580_driver_of_its_flavour_from_the_pinned_cuda_repository(
    provisioned: Provisioned, name: str, flavour: str, packages: list[str]
) -> None:
    node = provisioned.cluster.node(name)
    # The Fabric Manager node (gpu-worker-2) holds its driver with Fabric Manager.
    selection = "hold" if name == "gpu-worker-2" else "install"
    for package in packages:
        status = node.run(f"dpkg-query -W -f '${{Status}} ${{Version}}' {package}").stdout
        assert status.startswith(f"{selection} ok installed 580."), (flavour, package, status)
    other = "nvidia-headless-580" if flavour == "open" else "nvidia-headless-580-open"
    # Headless: not the other flavour, nor a full (desktop and compute) driver.
    for absent in (other, "nvidia-driver-580", "nvidia-driver-580-open"):
        status = node.run(f"dpkg-query -W -f '${{Status}}' {absent} 2>/dev/null || true").stdout
        assert "ok installed" not in status, absent
    # Branch 570 is there too and is not taken.
    assert "570." in node.run("apt-cache madison nvidia-headless-570-open").stdout
    # NVIDIA's cuda-repository-pin-600: apt ranks the CUDA repository above the distribution.
    policy = node.run(f"apt-cache policy {packages[0]}").stdout
    assert (
        f" 600 {provisioned.cluster.repo.base_url(node.host_address)}/compute/cuda/repos/" in policy
    ), policy
    assert "Pin-Priority: 600" in node.read("/etc/apt/preferences.d/cuda-repository-pin-600")


@pytest.mark.parametrize("name", UBUNTU_NODES)
def test_ubuntu_gets_docker_ce_from_dockers_repository(provisioned: Provisioned, name: str) -> None:
    node = provisioned.cluster.node(name)
    codename = node.run(". /etc/os-release && echo $VERSION_CODENAME").stdout.strip()
    sources = node.read("/etc/apt/sources.list.d/docker.sources")
    assert f"Suites: {codename}" in sources
    assert "Components: stable" in sources
    for package in ("docker-ce", "containerd.io", "docker-ce-cli", "docker-buildx-plugin"):
        assert "ok installed" in node.run(f"dpkg-query -W -f '${{Status}}' {package}").stdout


def test_fabric_manager_is_installed_and_enabled_where_asked(provisioned: Provisioned) -> None:
    nvswitch = provisioned.cluster.node("gpu-worker-2")
    assert (
        "ok installed"
        in nvswitch.run("dpkg-query -W -f '${Status}' nvidia-fabricmanager-580").stdout
    )
    assert nvswitch.run("systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"
    # Started once the driver was loaded (the check before joining starts it).
    assert nvswitch.run("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
    assert "nvidia-smi:" not in provisioned.converge_run.output
    # "auto" on a PCI bus without NVSwitches installs nothing.
    for name in ("gpu-cp-1", "gpu-worker-1"):
        node = provisioned.cluster.node(name)
        assert (
            "ok installed"
            not in node.run(
                "dpkg-query -W -f '${Status}' 'nvidia-fabricmanager-*' 2>/dev/null || true"
            ).stdout
        )


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_the_toolkits_cdi_refresh_keeps_a_specification(
    provisioned: Provisioned, name: str
) -> None:
    """Toolkit 1.18 (pinned on one node) installs nvidia-cdi-refresh in /etc/systemd/system, 1.20
    (the newest stand-in) in /lib/systemd/system; the role finds and enables it in either."""
    node = provisioned.cluster.node(name)
    pinned = NODE_VARS.get(name, {}).get("nvidia_container_toolkit_version", "1.20.0-1")
    assert node.run("dpkg-query -W -f '${Version}' nvidia-container-toolkit").stdout == pinned
    fragment = node.run("systemctl show -P FragmentPath nvidia-cdi-refresh.path").stdout.strip()
    expected = "/etc/systemd/system" if pinned.startswith("1.18.") else "/lib/systemd/system"
    assert (
        node.run(f"readlink -f {Path(fragment).parent}").stdout
        == node.run(f"readlink -f {expected}").stdout
    )
    assert node.run("systemctl is-enabled nvidia-cdi-refresh.path").stdout.strip() == "enabled"
    assert node.run("systemctl is-active nvidia-cdi-refresh.path").stdout.strip() == "active"


def test_kubeadm_init_that_failed_was_reset_and_retried_once(control_plane: Node) -> None:
    calls = _calls(control_plane, "/var/lib/kubeadm-standin/calls.jsonl")
    lifecycle = [call["argv"] for call in calls if call["argv"][:1] in (["init"], ["reset"])]
    init = ["init", "--config", "/etc/kubernetes/kubeadm-config.yaml"]
    # The failed init (admin.conf written, no API server), then reset and init; nothing on rerun.
    assert lifecycle == [init, ["reset", "--force"], init]
    assert (
        control_plane.run("test -f /etc/kubernetes/kubeadm-init-succeeded", check=False).returncode
        == 0
    )
    given = control_plane.read("/var/lib/kubeadm-standin/init-config.yaml")
    assert given == control_plane.read("/etc/kubernetes/kubeadm-config.yaml")
    documents = {document["kind"]: document for document in yaml.safe_load_all(given)}
    assert documents["InitConfiguration"]["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    registration = documents["InitConfiguration"]["nodeRegistration"]
    assert registration["kubeletExtraArgs"] == [GPU_LABELS_ARG]
    # The explicit taints replace kubeadm's default, so the control-plane taint must be listed too.
    assert registration["taints"] == [
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        GPU_TAINT,
    ]
    cluster = documents["ClusterConfiguration"]
    assert cluster["clusterName"] == "gct"
    assert cluster["kubernetesVersion"] == "v1.35.9"
    assert cluster["networking"] == {"podSubnet": "10.244.0.0/16", "serviceSubnet": "10.96.0.0/12"}
    assert documents["KubeletConfiguration"]["cgroupDriver"] == "systemd"


def test_worker_joined_once_with_a_token_from_the_control_plane(
    control_plane: Node, worker: Node
) -> None:
    joins = [
        call["argv"]
        for call in _calls(worker, "/var/lib/kubeadm-standin/calls.jsonl")
        if call["argv"][:1] == ["join"]
    ]
    assert joins == [["join", "--config", "/etc/kubernetes/kubeadm-join.yaml"]]
    token_requests = [
        call["argv"]
        for call in _calls(control_plane, "/var/lib/kubeadm-standin/calls.jsonl")
        if call["argv"][:2] == ["token", "create"]
    ]
    assert len(token_requests) == len(WORKERS)
    assert "--print-join-command" in token_requests[0]
    join = yaml.safe_load(worker.read("/var/lib/kubeadm-standin/join-config.yaml"))
    assert join["kind"] == "JoinConfiguration"
    bootstrap = join["discovery"]["bootstrapToken"]
    assert bootstrap["apiServerEndpoint"] == f"{control_plane.address}:6443"
    ca = (control_plane.root / "etc/kubernetes/pki/ca.crt").read_bytes()
    assert bootstrap["caCertHashes"] == [f"sha256:{hashlib.sha256(ca).hexdigest()}"]
    assert join["nodeRegistration"]["criSocket"] == "unix:///run/containerd/containerd.sock"
    assert join["nodeRegistration"]["kubeletExtraArgs"] == [GPU_LABELS_ARG]
    assert join["nodeRegistration"]["taints"] == [GPU_TAINT]
    # The join configuration holds the token: the role removes it after joining.
    assert not (worker.root / "etc/kubernetes/kubeadm-join.yaml").exists()


def test_a_worker_whose_join_failed_half_way_was_reset_and_joined_again(
    provisioned: Provisioned,
) -> None:
    # kubelet.conf was there before the converging run, the node unknown to the API server: the
    # role asked with the node's credentials, got NotFound, reset and joined (not skipped the join).
    node = provisioned.cluster.node(HALF_JOINED_WORKER)
    verbs = [
        call["argv"][0]
        for call in _calls(node, "/var/lib/kubeadm-standin/calls.jsonl")
        if call["argv"][:1] in (["reset"], ["join"])
    ]
    assert verbs == ["reset", "join"]
    assert node.read("/etc/kubernetes/kubelet.conf") != HALF_JOINED_KUBELET_CONF
    assert node.read("/var/lib/kubeadm-standin/registered-node").strip() == HALF_JOINED_WORKER
    asked = [
        call["argv"]
        for call in _calls(node, "/var/lib/kubectl-standin/calls.jsonl")
        if call["argv"][:2] == ["get", "node"]
    ]
    # Asked before the join (NotFound) and again in the rerun (found): never joined twice.
    assert len(asked) == 2, asked
    assert asked[0][2] == HALF_JOINED_WORKER
    assert "--kubeconfig=/etc/kubernetes/kubelet.conf" in asked[0]


def test_cni_manifest_was_applied_with_the_admin_kubeconfig(control_plane: Node) -> None:
    applies = [
        call
        for call in _calls(control_plane, "/var/lib/kubectl-standin/calls.jsonl")
        if call["argv"][:1] == ["apply"]
    ]
    assert applies
    assert all("--kubeconfig=/etc/kubernetes/admin.conf" in call["argv"] for call in applies)
    assert applies[0]["manifest"] == (PAYLOADS / "standin-cni.yaml").read_text()


def test_admin_kubeconfig_was_fetched_privately(
    provisioned: Provisioned, control_plane: Node
) -> None:
    fetched = Path(provisioned.inventory).parent / "admin.conf"
    assert fetched.read_text() == control_plane.read("/etc/kubernetes/admin.conf")
    assert stat.S_IMODE(fetched.stat().st_mode) == 0o600
