"""The MIG layout the nvidia_mig role applied, checked with testinfra on any host it ran on.

A host where the role applied no layout (``nvidia_mig_config`` empty: no boot unit) skips these
checks with that reason. Valid on the booted test nodes (against the stand-in nvidia-mig-parted)
and on real GPU hosts (`--hosts=...`, `--real-gpu` for nvidia-smi's view).
"""

from __future__ import annotations

import re

import pytest
import yaml
from testinfra.host import Host

pytestmark = pytest.mark.nodes

LAYOUT_UNIT = "gpu-cluster-mig-layout.service"
# nvidia-smi -L: "  MIG 1g.10gb     Device  0: (UUID: MIG-...)" under its GPU's line.
MIG_DEVICE_LINE = re.compile(r"^\s+MIG \S+\s+Device\s+\d+: \(UUID: MIG-", re.MULTILINE)


def _layout(node: Host) -> dict[str, str]:
    """The boot unit's MIG_PARTED_CONFIG_FILE and MIG_PARTED_SELECTED_CONFIG; skip without it."""
    if not node.file(f"/etc/systemd/system/{LAYOUT_UNIT}").exists:
        pytest.skip("no MIG layout configured on this host (the nvidia_mig role applied none)")
    environment = node.check_output(f"systemctl show --property=Environment --value {LAYOUT_UNIT}")
    return dict(item.split("=", 1) for item in environment.split() if "=" in item)


def test_the_mig_layout_is_applied_and_reapplied_at_boot_before_the_gpu_clients(
    node: Host,
) -> None:
    layout = _layout(node)
    config, selected = layout["MIG_PARTED_CONFIG_FILE"], layout["MIG_PARTED_SELECTED_CONFIG"]
    configs = yaml.safe_load(node.file(config).content_string)["mig-configs"]
    assert selected in configs, f"{selected} is not in {config}"
    applied = node.run(
        f"nvidia-mig-parted assert --config-file {config} --selected-config {selected}"
    )
    assert applied.rc == 0, f"{selected} is not applied: {applied.stderr.strip()}"
    unit = node.service(LAYOUT_UNIT)
    assert unit.is_enabled
    before = node.check_output(f"systemctl show --property=Before --value {LAYOUT_UNIT}").split()
    assert {"kubelet.service", "containerd.service"} <= set(before), before
    # The package's own boot service would apply its own selected configuration instead.
    assert not node.service("nvidia-mig-manager.service").is_enabled


@pytest.mark.gpu
def test_nvidia_smi_lists_the_mig_devices_of_the_layout(node: Host, real_gpu: None) -> None:
    _layout(node)
    exported = yaml.safe_load(node.check_output("nvidia-mig-parted export"))
    # One PCI device id per GPU ("0x20B210DE"), as device filters name them.
    ids = node.check_output("nvidia-smi --query-gpu=pci.device_id --format=csv,noheader").split()
    expected = 0
    for entry in exported["mig-configs"]["current"]:
        wanted = entry.get("device-filter") or []
        wanted = {int(f, 16) for f in ([wanted] if isinstance(wanted, str) else wanted)}
        gpus = [i for i, pci in enumerate(ids) if not wanted or int(pci, 16) in wanted]
        devices = gpus if entry["devices"] == "all" else entry["devices"]
        expected += len(devices) * sum((entry.get("mig-devices") or {}).values())
    listed = MIG_DEVICE_LINE.findall(node.check_output("nvidia-smi -L"))
    assert len(listed) == expected
