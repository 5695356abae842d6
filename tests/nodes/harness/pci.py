"""Stand-in PCI buses of GPU systems (test doubles): what /sys/bus/pci/devices shows on them.

The nodes share the host's sysfs, whose PCI bus has no GPU. A stand-in system is a folder of
device entries with the files the nvidia_driver role reads (vendor, device, class), bind-mounted
over /sys/bus/pci/devices inside one node (its own mount namespace: the host and the other
nodes keep the real bus). Ids from pci.ids (pciutils/pciids@c1c1254:pci.ids): 10de:2330
"GH100 [H100 SXM5 80GB]", 10de:22a3 "GH100 [H100 NVSwitch]", 10de:2901 "GB100 [B200]"; 15b3:1021
is the ConnectX-7 of HGX B200 boards. Classes as sysfs shows them: 0x030200 (3D controller) for
SXM GPUs, 0x068000 (other bridge) for an NVSwitch of HGX A100/H100/H200, 0x020700 (InfiniBand).
An HGX H100 8-GPU board carries four NVSwitches; an HGX B200 board's fourth-generation NVSwitches
are no host PCI devices (NVIDIA's Fabric Manager guide, "Systems Using Fourth Generation
NVSwitches": they are reached through the ConnectX-7 ports instead).
"""

from __future__ import annotations

from tests.nodes.harness.machine import Node

NVIDIA = "0x10de"
GPU_CLASS = "0x030200"
# Device -> (vendor, device id, class), per system.
SYSTEMS: dict[str, dict[str, tuple[str, str, str]]] = {
    "hgx-h100": {
        **{f"0000:{0x18 + 0x10 * i:02x}:00.0": (NVIDIA, "0x2330", GPU_CLASS) for i in range(8)},
        **{f"0000:{0xA5 + i:02x}:00.0": (NVIDIA, "0x22a3", "0x068000") for i in range(4)},
    },
    "hgx-b200": {
        **{f"0000:{0x18 + 0x10 * i:02x}:00.0": (NVIDIA, "0x2901", GPU_CLASS) for i in range(8)},
        **{f"0000:{0xA5 + i:02x}:00.0": ("0x15b3", "0x1021", "0x020700") for i in range(2)},
    },
}
STANDIN_ROOT = "/var/lib/pci-standin/devices"


def install(node: Node, system: str) -> None:
    """Show the stand-in system's PCI bus at /sys/bus/pci/devices inside the node."""
    for address, (vendor, device, klass) in SYSTEMS[system].items():
        folder = node.root / STANDIN_ROOT.lstrip("/") / address
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
            (folder / name).write_text(value + "\n")
    node.run(
        f"mountpoint -q /sys/bus/pci/devices || mount --bind {STANDIN_ROOT} /sys/bus/pci/devices"
    )
