"""GPU isolation on the provisioned nodes: no GPU by environment alone, a granted GPU arrives.

What is real: Docker and containerd (Debian's docker.io and containerd, also under the stand-in
Docker CE packages on the Ubuntu nodes), runc, the OCI spec Docker writes for each container, and
/etc/nvidia-container-runtime/config.toml as the nvidia_container_toolkit role left it.
Test double: nvidia-container-runtime (tests/nodes/standin/) decides which GPUs a container gets by
the toolkit's documented rules (volume mounts under /var/run/nvidia-container-devices/ first; then
NVIDIA_VISIBLE_DEVICES, for unprivileged containers only when
accept-nvidia-visible-devices-envvar-when-unprivileged is true) and hands out two stand-in GPUs as
/dev/nvidia0 and /dev/nvidia1 (bind mounts of /dev/null). No real GPU or driver is involved.
"""

from __future__ import annotations

import pytest

from tests.nodes.harness.cluster import DEFAULT_NODE_NAMES
from tests.nodes.harness.machine import Node
from tests.nodes.harness.provision import Provisioned

pytestmark = [pytest.mark.nodes, pytest.mark.slow]
CONFIG = "/etc/nvidia-container-runtime/config.toml"
RUNTIME_LOG = "/var/log/nvidia-container-runtime-standin.log"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
# What the device plugin's volume-mounts strategy adds to a container granted GPU 1.
GRANTED_GPU_1 = (
    "-e NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices "
    "-v /dev/null:/var/run/nvidia-container-devices/GPU-standin-1"
)


def _gpus_seen(node: Node, image: str, options: str) -> list[str]:
    ran = node.run(f"docker run --rm {options} {image} ls /dev", check=False)
    assert ran.returncode == 0, ran.stderr
    return sorted(name for name in ran.stdout.split() if name.startswith("nvidia"))


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_a_container_asking_by_environment_alone_gets_no_gpu(
    provisioned: Provisioned, name: str
) -> None:
    node = provisioned.cluster.node(name)
    before = len(node.read(RUNTIME_LOG).splitlines())
    assert _gpus_seen(node, provisioned.image, "-e NVIDIA_VISIBLE_DEVICES=all") == []
    new = node.read(RUNTIME_LOG).splitlines()[before:]
    assert any(
        line.endswith("ignoring NVIDIA_VISIBLE_DEVICES=all of an unprivileged container")
        for line in new
    ), new


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_a_container_granted_a_gpu_by_volume_mount_gets_exactly_that_one(
    provisioned: Provisioned, name: str
) -> None:
    node = provisioned.cluster.node(name)
    assert _gpus_seen(node, provisioned.image, GRANTED_GPU_1) == ["nvidia1", "nvidiactl"]


@pytest.mark.parametrize("name", DEFAULT_NODE_NAMES)
def test_a_privileged_container_like_dcgm_exporter_gets_every_gpu(
    provisioned: Provisioned, name: str
) -> None:
    node = provisioned.cluster.node(name)
    seen = _gpus_seen(node, provisioned.image, "--cap-add SYS_ADMIN -e NVIDIA_VISIBLE_DEVICES=all")
    assert seen == ["nvidia0", "nvidia1", "nvidiactl"]


def test_with_the_toolkits_default_the_environment_alone_takes_every_gpu(
    provisioned: Provisioned,
) -> None:
    """The counter-proof: the setting the role writes is what closes the leak."""
    node = provisioned.cluster.node(DEFAULT_NODE_NAMES[0])
    original = node.read(CONFIG)
    assert f"{ENVVAR_KEY} = false" in original.splitlines()
    try:
        node.run(f"sed -i 's/^{ENVVAR_KEY} = false$/{ENVVAR_KEY} = true/' {CONFIG}")
        leaked = _gpus_seen(node, provisioned.image, "-e NVIDIA_VISIBLE_DEVICES=all")
    finally:
        (node.root / CONFIG.lstrip("/")).write_text(original)
    assert leaked == ["nvidia0", "nvidia1", "nvidiactl"]
