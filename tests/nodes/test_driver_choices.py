"""What the nvidia_driver and container_runtime roles decide from what a host reports.

No node is booted (no root needed): real Ansible evaluates the roles' own vars files on localhost
for made-up hosts: kernel releases of several flavours, `apt-cache madison` answers, PCI buses with
and without an NVSwitch, `containerd --version` / `dockerd --version` outputs, and renders
containerd's configuration template. Test doubles: those command outputs (written after real
ones: Debian 12, Ubuntu, containerd.io, Docker CE); the booted nodes check the real ones.
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.nodes.harness.ansible_run import PLAYBOOKS, role_variables, run_local_play

ROLES = PLAYBOOKS / "roles"
DEBIAN_MADISON = [
    " nvidia-open-kernel-dkms | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security"
    " bookworm-security/contrib amd64 Packages",
    " nvidia-open-kernel-dkms | 535.261.03-1 | http://deb.debian.org/debian bookworm/contrib"
    " amd64 Packages",
    " nvidia-open-kernel-dkms | 525.147.05-4~deb12u1 | http://example.invalid/old amd64 Packages",
]
DEBIAN_RUNTIMES = (
    "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u1\n"
    "Docker version 20.10.24+dfsg1, build 297e128"
)
DOCKER_CE_RUNTIMES = (
    "containerd containerd.io 1.7.28 b98a3aace656320842a23f4a392a33f46af97866\n"
    "Docker version 28.5.1, build e180ab8"
)
# "vendor device class" per PCI device, as tasks/pci.yml reads them; ids from pci.ids
# (pciutils/pciids@c1c1254:pci.ids): H100 SXM5 2330 and its NVSwitch 22a3 (a bridge, class 0x0680),
# B200 2901, GB200 2941, L4 27b8; 15b3:1021 a ConnectX-7.
FABRICMANAGER_MADISON = [
    " nvidia-fabricmanager-580 | 580.105.08-1 | http://x/ Packages",
    " nvidia-fabricmanager-580 | 580.95.05-1 | http://x/ Packages",
    " nvidia-fabricmanager-580 | 580.95.050-1 | http://x/ Packages",
]
NVSWITCH_BUS = ["0x1af4 0x1000 0x020000", "0x10de 0x2330 0x030200", "0x10de 0x22a3 0x068000"]
PLAIN_BUS = ["0x1af4 0x1000 0x020000", "0x10de 0x27b8 0x030200"]
B200_BUS = ["0x15b3 0x1021 0x020700", *["0x10de 0x2901 0x030200"] * 8]
GB200_BUS = ["0x15b3 0x1021 0x020700", *["0x10de 0x2941 0x030200"] * 4]

# Host -> (facts, host variables).
HOSTS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "debian-cloud": (
        {"kernel": "6.1.0-18-cloud-amd64", "distribution": "Debian"},
        {
            "_nvidia_driver_madison": {"stdout_lines": DEBIAN_MADISON},
            "_nvidia_driver_pci": {"stdout_lines": PLAIN_BUS},
            "_container_runtime_versions": {"stdout": DEBIAN_RUNTIMES},
        },
    ),
    "ubuntu-aws-hgx": (
        {"kernel": "6.8.0-1015-aws", "distribution": "Ubuntu"},
        {
            "_nvidia_driver_madison": {
                "stdout_lines": [
                    " nvidia-headless-580-open | 580.95.05-0ubuntu1 | http://x/ Packages"
                ]
            },
            "_nvidia_driver_pci": {"stdout_lines": NVSWITCH_BUS},
            "_container_runtime_versions": {"stdout": DOCKER_CE_RUNTIMES},
            # The driver predates the repository's newest release.
            "_nvidia_driver_package_state": {"stdout": "installed 580.95.05-0ubuntu1"},
            "_nvidia_driver_fabricmanager_madison": {"stdout_lines": FABRICMANAGER_MADISON},
        },
    ),
    "ubuntu-custom-kernel-proprietary": (
        {"kernel": "6.18.0", "distribution": "Ubuntu"},
        {
            "nvidia_driver_kernel_modules": "proprietary",
            "nvidia_driver_fabricmanager": False,
            "_nvidia_driver_madison": {"stdout_lines": []},
            "_nvidia_driver_pci": {"stdout_lines": NVSWITCH_BUS},
            "_container_runtime_versions": {"stdout": ""},
        },
    ),
    "ubuntu-hgx-b200": (
        {"kernel": "6.8.0-1015-aws", "distribution": "Ubuntu"},
        {
            # A driver that NVIDIA's .run installer put there: modinfo's version counts.
            "_nvidia_driver_installed": {"rc": 0, "stdout": "580.105.08"},
            "_nvidia_driver_package_state": {"stdout": ""},
            "_nvidia_driver_fabricmanager_madison": {"stdout_lines": FABRICMANAGER_MADISON},
            "_nvidia_driver_madison": {"stdout_lines": []},
            "_nvidia_driver_pci": {"stdout_lines": B200_BUS},
            "_container_runtime_versions": {"stdout": DOCKER_CE_RUNTIMES},
        },
    ),
    "ubuntu-gb200-tray": (
        {"kernel": "6.8.0-1015-aws", "distribution": "Ubuntu"},
        {
            "_nvidia_driver_madison": {"stdout_lines": []},
            "_nvidia_driver_pci": {"stdout_lines": GB200_BUS},
            "_container_runtime_versions": {"stdout": DOCKER_CE_RUNTIMES},
        },
    ),
    "ubuntu-b200-nvlsm-off": (
        {"kernel": "6.8.0-1015-aws", "distribution": "Ubuntu"},
        {
            "nvidia_driver_nvlsm": False,
            "_nvidia_driver_madison": {"stdout_lines": []},
            "_nvidia_driver_pci": {"stdout_lines": B200_BUS},
            "_container_runtime_versions": {"stdout": DOCKER_CE_RUNTIMES},
        },
    ),
    "debian-old-branch": (
        {"kernel": "6.1.0-18-amd64", "distribution": "Debian"},
        {
            "nvidia_driver_branch": "470",
            "_nvidia_driver_madison": {"stdout_lines": DEBIAN_MADISON},
            "_nvidia_driver_pci": {"stdout_lines": []},
            "_container_runtime_versions": {"stdout": DEBIAN_RUNTIMES},
        },
    ),
}
DECISIONS = {
    "branch": "nvidia_driver_branch",
    "modules": "nvidia_driver_kernel_modules",
    "headers": "nvidia_driver_kernel_headers_packages",
    "probe": "_nvidia_driver_branch_probe",
    "packages": "_nvidia_driver_packages",
    "version": "_nvidia_driver_branch_version",
    "fabricmanager": "_nvidia_driver_fabricmanager_wanted | bool",
    "nvlsm": "_nvidia_driver_nvlsm_wanted | bool",
    "fabricmanager_version": "_nvidia_driver_fabricmanager_version",
    "held": "_nvidia_driver_held_packages",
    "containerd_cdi": "_container_runtime_containerd_cdi | bool",
    "docker_options": "_container_runtime_docker_managed_options",
    "sources": "_nvidia_driver_debian_sources | default([])",
}
PLAYBOOK = """
- name: Evaluate the roles' decisions.
  hosts: all
  gather_facts: false
  vars:
    ansible_facts:
      kernel: "{{{{ test_facts.kernel }}}}"
      distribution: "{{{{ test_facts.distribution }}}}"
      distribution_release: bookworm
    driver_vars: "{roles}/nvidia_driver/vars"
  tasks:
    - name: Load the distribution's driver variables.
      ansible.builtin.include_vars: "{{{{ driver_vars }}}}/{{{{ test_facts.distribution }}}}.yml"
    - name: Write the decisions.
      ansible.builtin.copy:
        content: "{{{{ {decisions} | to_json }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.json"
        mode: "0600"
    - name: Render the Debian driver's version pin.
      ansible.builtin.template:
        src: {roles}/nvidia_driver/templates/nvidia-driver-version.j2
        dest: "{out}/{{{{ inventory_hostname }}}}-driver-pin"
        mode: "0600"
      when: test_facts.distribution == 'Debian'
    - name: Render containerd's configuration.
      ansible.builtin.template:
        src: {roles}/container_runtime/templates/containerd-config.toml.j2
        dest: "{out}/{{{{ inventory_hostname }}}}-containerd.toml"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def decided(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("driver-choices")
    out = workdir / "out"
    out.mkdir()
    inventory = {
        "all": {
            "vars": {
                **role_variables("nvidia_driver", "container_runtime"),
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "group_names": ["gpu_nodes"],
            },
            "hosts": {
                name: {"test_facts": facts, **host_vars}
                for name, (facts, host_vars) in HOSTS.items()
            },
        }
    }
    decisions = "{" + ", ".join(f"'{key}': {value}" for key, value in DECISIONS.items()) + "}"
    run_local_play(workdir, inventory, PLAYBOOK.format(roles=ROLES, out=out, decisions=decisions))
    return out


def _decisions(decided: Path, host: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((decided / f"{host}.json").read_text())
    return loaded


def test_debian_defaults_to_535_open_modules_pinned_to_the_module_packages_newest_version(
    decided: Path,
) -> None:
    debian = _decisions(decided, "debian-cloud")
    assert (debian["branch"], debian["modules"]) == ("535", "open")
    assert debian["probe"] == "nvidia-open-kernel-dkms"
    assert debian["version"] == "535.309.01-0+deb12u1"
    # Headless: no nvidia-driver metapackage (X server, GL, Vulkan); persistenced unpinned.
    pinned = ["nvidia-smi", "libcuda1", "libnvidia-nvvm4", "libnvidia-cfg1", "nvidia-cuda-mps"]
    assert debian["packages"] == [
        *(f"{package}=535.309.01-0+deb12u1" for package in pinned),
        "nvidia-open-kernel-dkms=535.309.01-0+deb12u1",
        "nvidia-persistenced",
    ]
    assert [source["name"] for source in debian["sources"]] == [
        "debian-non-free",
        "debian-security-non-free",
    ]
    assert debian["sources"][1]["suites"] == ["bookworm-security"]
    assert debian["sources"][1]["uri"] == "http://deb.debian.org/debian-security"
    assert debian["headers"] == [
        "linux-headers-6.1.0-18-cloud-amd64",
        "linux-headers-cloud-amd64",
        "dkms",
    ]
    assert debian["fabricmanager"] is False


def test_debian_keeps_every_package_of_the_drivers_sources_at_the_modules_version(
    decided: Path,
) -> None:
    # The open module exists in 535.261.03-1 only while the security archive has 535.309.01
    # userspace: without this pin apt resolves libcuda1's dependencies to the newer version.
    stanza = dict(
        line.split(": ", 1)
        for line in (decided / "debian-cloud-driver-pin").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert stanza == {
        "Package": "src:nvidia-graphics-drivers src:nvidia-open-gpu-kernel-modules",
        "Pin": "version 535.309.01-0+deb12u1",
        "Pin-Priority": "990",
    }


def test_a_branch_the_repositories_lack_finds_no_version(decided: Path) -> None:
    old = _decisions(decided, "debian-old-branch")
    assert (old["branch"], old["modules"]) == ("470", "proprietary")
    assert old["probe"] == "nvidia-kernel-dkms"
    assert old["version"] == ""
    assert old["headers"][1] == "linux-headers-amd64"


def test_ubuntu_defaults_to_580_open_and_fabric_manager_on_an_nvswitch_bus(decided: Path) -> None:
    hgx = _decisions(decided, "ubuntu-aws-hgx")
    assert (hgx["branch"], hgx["modules"]) == ("580", "open")
    assert hgx["probe"] == "nvidia-headless-580-open"
    assert hgx["packages"] == ["nvidia-headless-580-open", "nvidia-utils-580"]
    assert hgx["version"] == "580.95.05-0ubuntu1"
    assert hgx["headers"] == ["linux-headers-6.8.0-1015-aws", "linux-headers-aws", "dkms"]
    assert hgx["fabricmanager"] is True
    assert hgx["nvlsm"] is False  # HGX H100: NVSwitch bridges, Fabric Manager alone


def test_proprietary_modules_and_fabric_manager_forced_off(decided: Path) -> None:
    custom = _decisions(decided, "ubuntu-custom-kernel-proprietary")
    assert custom["packages"] == ["nvidia-headless-580", "nvidia-utils-580"]
    assert custom["fabricmanager"] is False
    # A kernel the distribution did not build has no flavour meta-package.
    assert custom["headers"] == ["linux-headers-6.18.0", "dkms"]


@pytest.mark.parametrize(
    ("host", "cdi"),
    [
        ("debian-cloud", False),
        ("ubuntu-aws-hgx", True),
        ("ubuntu-custom-kernel-proprietary", False),
    ],
)
def test_cdi_is_switched_on_where_containerd_and_docker_have_it(
    decided: Path, host: str, cdi: bool
) -> None:
    decisions = _decisions(decided, host)
    assert decisions["containerd_cdi"] is cdi
    assert ("features" in decisions["docker_options"]) is cdi
    config = tomllib.loads((decided / f"{host}-containerd.toml").read_text())
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri.get("enable_cdi", False) is cdi
    if cdi:
        assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]


def test_an_hgx_b200_gets_fabric_manager_and_nvlsm_from_its_gpus_ids(decided: Path) -> None:
    # Fourth-generation NVSwitches are no PCI bridges: the B200 GPUs tell.
    b200 = _decisions(decided, "ubuntu-hgx-b200")
    assert (b200["fabricmanager"], b200["nvlsm"]) == (True, True)
    # nvlsm forced off leaves Fabric Manager to the NVSwitch bridges (none here).
    off = _decisions(decided, "ubuntu-b200-nvlsm-off")
    assert (off["fabricmanager"], off["nvlsm"]) == (False, False)


def test_a_gb200_compute_tray_runs_neither(decided: Path) -> None:
    # GB200 NVL: the NVLink switch trays run Fabric Manager and the subnet manager.
    gb200 = _decisions(decided, "ubuntu-gb200-tray")
    assert (gb200["fabricmanager"], gb200["nvlsm"]) == (False, False)
    assert _decisions(decided, "debian-cloud")["nvlsm"] is False


def test_fabric_manager_takes_the_installed_drivers_version_not_the_newest(decided: Path) -> None:
    hgx = _decisions(decided, "ubuntu-aws-hgx")
    assert hgx["fabricmanager_version"] == "580.95.05-1"
    assert hgx["held"] == [
        "nvidia-headless-580-open",
        "nvidia-utils-580",
        "nvidia-fabricmanager-580",
    ]
    # No driver package: the loaded module's version (modinfo) decides.
    assert _decisions(decided, "ubuntu-hgx-b200")["fabricmanager_version"] == "580.105.08-1"
    # No Fabric Manager of the driver's version: none (the role then stops, naming what is offered).
    assert _decisions(decided, "ubuntu-gb200-tray")["fabricmanager_version"] == ""
