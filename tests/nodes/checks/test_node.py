"""What the playbooks promise on every GPU node, checked with testinfra.

Valid on the booted test nodes and on real hosts (`--hosts=...`): nothing here depends on the
stand-in packages. Stand-in specific checks live in tests/nodes/test_standin_cluster.py.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
import yaml
from testinfra.host import Host

pytestmark = pytest.mark.nodes

KUBERNETES_PACKAGES = ("kubelet", "kubeadm", "kubectl")
REQUIRED_SYSCTLS = (
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.ipv4.ip_forward",
)


def _installed(node: Host, *names: str) -> list[str]:
    return [name for name in names if node.package(name).is_installed]


def test_runs_a_supported_operating_system(node: Host) -> None:
    system = node.system_info
    assert (system.distribution, system.release) in {
        ("debian", "12"),
        ("ubuntu", "22.04"),
        ("ubuntu", "24.04"),
    } or (system.distribution == "debian" and system.release.startswith("12."))


def test_kubernetes_packages_are_installed_at_the_wanted_version_and_held(
    node: Host, kubernetes_version: str
) -> None:
    held = node.check_output("apt-mark showhold").split()
    for name in KUBERNETES_PACKAGES:
        package = node.package(name)
        assert package.is_installed, name
        assert package.version.startswith(f"{kubernetes_version}-"), (name, package.version)
        assert name in held, f"{name} is not held: {held}"


def test_container_runtime_and_toolkit_packages_are_installed(node: Host) -> None:
    assert _installed(node, "docker.io", "docker-ce"), "no Docker package"
    assert _installed(node, "containerd", "containerd.io"), "no containerd package"
    for name in ("nvidia-container-toolkit", "nvidia-container-toolkit-base"):
        assert node.package(name).is_installed, name
    assert node.file("/usr/bin/nvidia-container-runtime").mode & 0o111


def test_nvidia_driver_packages_are_installed(node: Host) -> None:
    if node.system_info.distribution == "debian":
        for name in ("nvidia-smi", "libcuda1", "libnvidia-ml1"):
            assert node.package(name).is_installed, name
        assert _installed(node, "nvidia-open-kernel-dkms", "nvidia-kernel-dkms")
    else:
        # Headless (compute-only) or full driver of a branch.
        drivers = node.check_output(
            "dpkg-query -W -f '${Package} ${Status}\\n' 'nvidia-headless-*' 'nvidia-driver-*'"
            " || true"
        )
        assert any(line.endswith("ok installed") for line in drivers.splitlines()), drivers
    assert node.exists("nvidia-smi")


@pytest.mark.parametrize("service", ["containerd", "docker"])
def test_runtimes_are_running_and_enabled(node: Host, service: str) -> None:
    assert node.service(service).is_running
    assert node.service(service).is_enabled


def test_docker_daemon_json_uses_the_nvidia_runtime_and_systemd_cgroups(node: Host) -> None:
    daemon = json.loads(node.file("/etc/docker/daemon.json").content_string)
    assert daemon["default-runtime"] == "nvidia"
    assert daemon["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    assert "native.cgroupdriver=systemd" in daemon["exec-opts"]


def test_docker_really_uses_the_nvidia_runtime(node: Host) -> None:
    info = json.loads(node.check_output("docker info --format '{{json .}}'"))
    assert info["DefaultRuntime"] == "nvidia"
    assert "nvidia" in info["Runtimes"]
    assert info["CgroupDriver"] == "systemd"


def _containerd_version(node: Host) -> tuple[int, int]:
    """(major, minor) from `containerd --version` ("containerd <source> 1.6.20~ds1 <revision>")."""
    version = node.check_output("containerd --version").split()[2].lstrip("v")
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _loaded_cri_config(node: Host) -> dict[str, Any]:
    """The CRI plugin's configuration as containerd loaded it (`containerd config dump`)."""
    dumped = tomllib.loads(node.check_output("containerd config dump"))
    plugins = dumped["plugins"]
    cri: dict[str, Any] = plugins.get("io.containerd.grpc.v1.cri", {})
    if "containerd" in cri:
        return cri
    # containerd 2.x (config version 3) moved the runtimes to their own plugin.
    runtime: dict[str, Any] = plugins["io.containerd.cri.v1.runtime"]
    return runtime


def test_containerd_loaded_the_nvidia_runtime_and_systemd_cgroups(node: Host) -> None:
    runtimes = _loaded_cri_config(node)["containerd"]
    assert runtimes["default_runtime_name"] == "nvidia"
    nvidia = runtimes["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert nvidia["options"]["SystemdCgroup"] is True
    assert runtimes["runtimes"]["runc"]["options"]["SystemdCgroup"] is True


def test_containerd_hands_out_cdi_devices_where_it_can(node: Host) -> None:
    """CDI from containerd 1.7 (2.x: always on); Debian 12's 1.6 has no CDI at all."""
    cri = _loaded_cri_config(node)
    if _containerd_version(node) >= (1, 7):
        assert cri["enable_cdi"] is True
        assert "/var/run/cdi" in cri["cdi_spec_dirs"]
    else:
        assert "enable_cdi" not in cri


def test_toolkit_ignores_the_environment_of_unprivileged_containers(node: Host) -> None:
    """Only the device plugin's volume mounts (or CDI) grant GPUs, not the NVIDIA_VISIBLE_DEVICES
    of CUDA images (infra/platform.py's device plugin uses the volume-mounts strategy to match)."""
    config = tomllib.loads(node.file("/etc/nvidia-container-runtime/config.toml").content_string)
    assert config["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert config["accept-nvidia-visible-devices-as-volume-mounts"] is True


def test_crictl_is_installed_from_cri_tools(node: Host) -> None:
    """kubeadm has had no Depends since 1.32 (kubernetes/release's krel metadata.yaml): the
    kubernetes_node role installs cri-tools itself; nvidia_mig stops GPU pods through crictl."""
    assert node.package("cri-tools").is_installed
    assert node.file("/usr/bin/crictl").mode & 0o111


def test_containerd_answers_on_its_cri_socket(node: Host) -> None:
    assert node.socket("unix:///run/containerd/containerd.sock").is_listening


def test_docker_runs_a_container(node: Host, docker_image: str) -> None:
    output = node.check_output(f"docker run --rm {docker_image} cat /etc/debian_version")
    assert output.strip()


def _loaded_or_builtin(node: Host, module: str) -> bool:
    """Loaded (/proc/modules) or built into the kernel (modules.builtin; kernels without
    loadable-module support have no /proc/modules at all)."""
    proc_modules = node.file("/proc/modules")
    if proc_modules.exists and any(
        line.split()[0] == module for line in proc_modules.content_string.splitlines()
    ):
        return True
    builtin = node.file(f"/lib/modules/{node.check_output('uname -r')}/modules.builtin")
    return builtin.exists and any(
        line.endswith(f"/{module}.ko") for line in builtin.content_string.splitlines()
    )


def test_kernel_modules_load_at_boot_and_are_loaded(node: Host) -> None:
    configured = node.check_output("cat /etc/modules-load.d/*.conf").split()
    for module in ("overlay", "br_netfilter"):
        assert module in configured
        assert _loaded_or_builtin(node, module), f"{module} neither loaded nor built in"


def test_sysctls_are_persisted_and_live(node: Host) -> None:
    persisted = node.check_output("cat /etc/sysctl.d/*.conf")
    for key in REQUIRED_SYSCTLS:
        assert any(line.replace(" ", "") == f"{key}=1" for line in persisted.splitlines()), (
            f"{key}=1 not in /etc/sysctl.d"
        )
        assert node.sysctl(key) == 1, key


def test_swap_is_off_now_and_at_boot(node: Host) -> None:
    assert node.check_output("swapon --noheadings --show") == ""
    for line in node.file("/etc/fstab").content_string.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            assert "swap" not in fields[2:3], f"active swap entry in fstab: {line}"


def test_kubelet_is_enabled(node: Host) -> None:
    assert node.service("kubelet").is_enabled


def test_node_joined_the_cluster(node: Host) -> None:
    """kubeadm init or join ran: the kubelet has its kubeconfig."""
    assert node.file("/etc/kubernetes/kubelet.conf").exists


def test_control_plane_kubeadm_config_is_as_intended(
    node: Host, is_control_plane: bool, kubernetes_version: str
) -> None:
    if not is_control_plane:
        pytest.skip("a worker has no kubeadm init configuration")
    documents = {
        document["kind"]: document
        for document in yaml.safe_load_all(
            node.file("/etc/kubernetes/kubeadm-config.yaml").content_string
        )
    }
    assert documents["InitConfiguration"]["nodeRegistration"]["criSocket"] == (
        "unix:///run/containerd/containerd.sock"
    )
    cluster = documents["ClusterConfiguration"]
    assert cluster["kubernetesVersion"].lstrip("v") == kubernetes_version
    assert cluster["networking"]["podSubnet"]
    assert cluster["networking"]["serviceSubnet"]
    assert documents["KubeletConfiguration"]["cgroupDriver"] == "systemd"
    assert node.file("/etc/kubernetes/admin.conf").exists


@pytest.mark.gpu
def test_nvidia_smi_lists_the_gpus(node: Host, real_gpu: None) -> None:
    gpus = node.check_output("nvidia-smi -L").splitlines()
    assert gpus
    assert all(line.startswith("GPU ") for line in gpus)


@pytest.mark.gpu
def test_a_container_sees_the_gpus_through_the_nvidia_runtime(
    node: Host, real_gpu: None, docker_image: str
) -> None:
    output = node.check_output(f"docker run --rm --gpus all {docker_image} nvidia-smi -L")
    assert output.startswith("GPU ")


@pytest.mark.gpu
def test_an_unprivileged_container_asking_by_environment_alone_gets_no_gpu(
    node: Host, real_gpu: None, docker_image: str
) -> None:
    devices = node.check_output(
        f"docker run --rm -e NVIDIA_VISIBLE_DEVICES=all {docker_image} "
        "sh -c 'ls /dev | grep -c ^nvidia || true'"
    )
    assert devices.strip() == "0"
