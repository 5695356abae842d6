"""The node side and the cluster side of GPU isolation agree (no root, no node).

The nvidia_container_toolkit role's defaults must be the toolkit settings infra/ gives EKS GPU
nodes, and must accept exactly what infra/'s device plugin hands out (volume mounts).
"""

from __future__ import annotations

import yaml

from infra.eks import TOOLKIT_SETTINGS
from infra.platform import device_plugin_values
from tests.nodes.harness.ansible_run import PLAYBOOKS

DEFAULTS = PLAYBOOKS / "roles/nvidia_container_toolkit/defaults/main.yml"


def _role_settings() -> set[str]:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    envvar = defaults["nvidia_container_toolkit_accept_envvar_when_unprivileged"]
    mounts = defaults["nvidia_container_toolkit_accept_volume_mounts"]
    return {
        f"accept-nvidia-visible-devices-envvar-when-unprivileged={str(envvar).lower()}",
        f"accept-nvidia-visible-devices-as-volume-mounts={str(mounts).lower()}",
    }


def test_the_role_sets_what_infra_sets_on_eks_gpu_nodes() -> None:
    assert _role_settings() == set(TOOLKIT_SETTINGS)


def test_the_device_plugin_hands_out_what_the_nodes_accept() -> None:
    values = device_plugin_values()
    assert values["deviceListStrategy"] == "volume-mounts"
    assert "accept-nvidia-visible-devices-as-volume-mounts=true" in _role_settings()
    assert values["deviceIDStrategy"] == "uuid"
