"""What the nvidia_driver role decides before a GPU host joins: whether it may load the module
without a reboot, and why it stops the host.

No node is booted (no root needed): real Ansible evaluates the role's own variables on localhost
for made-up hosts, from what its tasks would have registered there (nvidia-smi's answer,
/proc/modules, nouveau, `modinfo nvidia`, Fabric Manager's systemd state). The booted test nodes
run the tasks themselves (tests/nodes/test_playbooks.py), but their kernel loads no modules, so
the modprobe path is decided here only.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.nodes.harness.ansible_run import role_decisions

SMI_FAILS = {"rc": 9, "stdout_lines": ["NVIDIA-SMI has failed because it couldn't communicate"]}
LOADABLE = {
    "_nvidia_driver_smi": SMI_FAILS,
    "_nvidia_driver_proc_modules": {"stat": {"exists": True}},
    "_nvidia_driver_nouveau": {"stat": {"exists": False}},
    "_nvidia_driver_module_file": {"rc": 0},
    "_nvidia_driver_works": False,
    "_nvidia_driver_smi_said": SMI_FAILS["stdout_lines"][0],
    "nvidia_driver_fabricmanager": False,
}
WORKING = {**LOADABLE, "_nvidia_driver_smi": {"rc": 0}, "_nvidia_driver_works": True}
HOSTS: dict[str, dict[str, Any]] = {
    "loads-now": LOADABLE,
    "nouveau-holds-the-gpus": {**LOADABLE, "_nvidia_driver_nouveau": {"stat": {"exists": True}}},
    "kernel-without-modules": {
        **LOADABLE,
        "_nvidia_driver_proc_modules": {"stat": {"exists": False}},
    },
    "no-module-for-this-kernel": {**LOADABLE, "_nvidia_driver_module_file": {"rc": 1}},
    "loading-switched-off": {**LOADABLE, "nvidia_driver_load_module": False},
    "working": WORKING,
    "hgx-fabric-manager-failed": {
        **WORKING,
        "nvidia_driver_fabricmanager": True,
        "_nvidia_driver_fabricmanager_state": {"status": {"ActiveState": "failed"}},
    },
    "hgx-fabric-manager-active": {
        **WORKING,
        "nvidia_driver_fabricmanager": True,
        "_nvidia_driver_fabricmanager_state": {"status": {"ActiveState": "active"}},
    },
}


@pytest.fixture(scope="module")
def decided(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return role_decisions(
        tmp_path_factory.mktemp("before-join"),
        ("nvidia_driver",),
        HOSTS,
        {"can_load": "_nvidia_driver_can_load | bool", "not_ready": "_nvidia_driver_not_ready"},
    )


def test_the_module_is_loaded_without_a_reboot_only_where_the_kernel_allows(
    decided: dict[str, dict[str, Any]],
) -> None:
    can_load = {host: decision["can_load"] for host, decision in decided.items()}
    assert can_load == {
        "loads-now": True,
        "nouveau-holds-the-gpus": False,
        "kernel-without-modules": False,
        "no-module-for-this-kernel": False,
        "loading-switched-off": False,
        "working": False,  # nothing to load
        "hgx-fabric-manager-failed": False,
        "hgx-fabric-manager-active": False,
    }


def test_a_host_without_a_working_driver_is_stopped_with_one_line_saying_what_to_do(
    decided: dict[str, dict[str, Any]],
) -> None:
    message = decided["nouveau-holds-the-gpus"]["not_ready"]
    assert message.startswith(
        "NVIDIA driver not loaded on nouveau-holds-the-gpus (nvidia-smi: NVIDIA-SMI has failed "
        "because it couldn't communicate), so it does not join the cluster"
    )
    assert "Reboot it" in message
    assert "nvidia_driver_reboot_allowed: true" in message
    assert "\n" not in message
    assert "  " not in message


def test_an_nvswitch_host_needs_an_active_fabric_manager(
    decided: dict[str, dict[str, Any]],
) -> None:
    message = decided["hgx-fabric-manager-failed"]["not_ready"]
    assert message.startswith(
        "NVIDIA Fabric Manager is not active on hgx-fabric-manager-failed, an NVSwitch system"
    )
    assert "error 802" in message
    assert "\n" not in message
    assert decided["hgx-fabric-manager-active"]["not_ready"] == ""
    assert decided["working"]["not_ready"] == ""  # no NVSwitch: no Fabric Manager needed
