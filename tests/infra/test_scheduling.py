"""Where pods can run: the scheduler's taint, selector and affinity rules, and the node pools a
kubeadm inventory makes (read with Ansible's own inventory loader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.gpu import gpu_node_selector, gpu_tolerations
from infra.kubeadm_inventory import InventoryError, api_server_url, read_nodes, system_pods_fit
from infra.scheduling import (
    CONTROL_PLANE_TAINT,
    GPU_TAINT,
    NodePool,
    PodPlacement,
    Taint,
    expression_matches,
    label_selector_matches,
    misfit,
    required_affinity_matches,
    tolerates,
)
from tests.infra.conftest import KUBEADM_STACK, REPO_ROOT

GPU_POOL = NodePool(
    "gpu", {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}, (GPU_TAINT,)
)
CPU_POOL = NodePool("cpu", {"kubernetes.io/os": "linux"})


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, GPU_TAINT, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU_TAINT, True),  # any effect
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, GPU_TAINT, False),
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, GPU_TAINT, True),
        ({"key": "nvidia.com/gpu", "value": "absent"}, GPU_TAINT, False),  # Equal by default
        ({"operator": "Exists"}, CONTROL_PLANE_TAINT, True),  # tolerates everything
        ({"key": "CriticalAddonsOnly", "operator": "Exists"}, GPU_TAINT, False),
    ],
)
def test_tolerations(toleration: dict[str, str], taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


@pytest.mark.parametrize(
    ("operator", "values", "labels", "expected"),
    [
        ("In", ["a", "b"], {"k": "b"}, True),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {}, True),
        ("NotIn", ["a"], {"k": "a"}, False),
        ("Exists", [], {"k": ""}, True),
        ("DoesNotExist", [], {"k": ""}, False),
        ("Gt", ["3"], {"k": "4"}, True),
        ("Lt", ["3"], {"k": "4"}, False),
        ("Gt", ["3"], {"k": "x"}, False),
    ],
)
def test_selector_operators(
    operator: str, values: list[str], labels: dict[str, str], expected: bool
) -> None:
    assert (
        expression_matches({"key": "k", "operator": operator, "values": values}, labels) is expected
    )


def test_label_selectors() -> None:
    assert label_selector_matches({}, {"a": "1"})  # empty: everything
    assert not label_selector_matches(None, {"a": "1"})  # null: nothing
    selector = {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}
    assert label_selector_matches(selector, {"a": "1", "b": ""})
    assert not label_selector_matches(selector, {"a": "1"})


def test_required_node_affinity_is_any_term() -> None:
    """The device plugin chart's default: NFD's NVIDIA PCI label, or nvidia.com/gpu.present."""
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "pci-10de", "operator": "In", "values": ["true"]}
                        ]
                    },
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                        ]
                    },
                ]
            }
        }
    }
    assert required_affinity_matches(affinity, GPU_POOL.labels)
    assert not required_affinity_matches(affinity, CPU_POOL.labels)
    assert required_affinity_matches({}, CPU_POOL.labels)


def test_gpu_layer_placement_fits_gpu_pools_only() -> None:
    gpu_pods = PodPlacement(node_selector=gpu_node_selector(), tolerations=gpu_tolerations())
    assert misfit(gpu_pods, GPU_POOL) is None
    assert (
        misfit(gpu_pods, CPU_POOL)
        == "nodeSelector {'nvidia.com/gpu.present': 'true'} does not match"
    )
    assert (
        misfit(PodPlacement(), GPU_POOL) == "taint nvidia.com/gpu=present:NoSchedule not tolerated"
    )
    assert misfit(PodPlacement(), CPU_POOL) is None


# -- kubeadm inventories ------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "hosts.ini") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_example_inventory_has_a_node_for_the_cluster_services() -> None:
    nodes = {n.name: n for n in read_nodes(KUBEADM_STACK / "inventory.example.ini")}
    assert set(nodes) == {"cp-1", "cpu-1", "gpu-1", "gpu-2"}
    assert nodes["cp-1"].taints == (CONTROL_PLANE_TAINT,)
    assert nodes["cp-1"].labels["node-role.kubernetes.io/control-plane"] == ""
    assert nodes["gpu-1"].taints == (GPU_TAINT,)
    assert nodes["gpu-1"].labels["nvidia.com/gpu.present"] == "true"
    assert nodes["cpu-1"].taints == ()
    assert system_pods_fit(list(nodes.values()))
    assert api_server_url(list(nodes.values())) == "https://192.0.2.10:6443"


def test_playbooks_example_inventory_agrees() -> None:
    """playbooks/inventory/example.yml (with its group_vars) describes a cluster that comes up."""
    nodes = read_nodes(REPO_ROOT / "playbooks" / "inventory" / "example.yml")
    assert {n.name for n in nodes if not n.taints} == {"cpu-1"}
    assert system_pods_fit(nodes)


def test_variables_change_labels_and_taints(tmp_path: Path) -> None:
    """One host in every group: schedulable, GPU label without the taint (group_vars or -e)."""
    inventory = write(
        tmp_path,
        "[gpu_nodes]\nlab\n[control_plane]\nlab\n[workers]\nlab\n"
        "[all:vars]\nkubeadm_control_plane_gpu_node_taint_enabled=false\n",
    )
    (lab,) = read_nodes(inventory)
    assert lab.gpu
    assert lab.control_plane
    assert lab.taints == (CONTROL_PLANE_TAINT,)
    assert not system_pods_fit([lab])
    (lab,) = read_nodes(inventory, {"kubeadm_control_plane_schedulable": True})
    assert lab.taints == ()
    assert lab.labels["nvidia.com/gpu.present"] == "true"
    assert system_pods_fit([lab])


def test_roles_defaults_are_what_the_model_assumes() -> None:
    """The defaults read_nodes falls back on are the roles' (a control plane keeps its taint)."""
    roles = REPO_ROOT / "playbooks" / "roles"
    control_plane = yaml.safe_load((roles / "kubeadm_control_plane/defaults/main.yml").read_text())
    worker = yaml.safe_load((roles / "kubeadm_worker/defaults/main.yml").read_text())
    assert control_plane["kubeadm_control_plane_schedulable"] is False
    for role, defaults in (("kubeadm_control_plane", control_plane), ("kubeadm_worker", worker)):
        assert defaults[f"{role}_gpu_node_taint_enabled"] is True
        assert defaults[f"{role}_gpu_node_taint"] == {
            "key": GPU_TAINT.key,
            "value": GPU_TAINT.value,
            "effect": GPU_TAINT.effect,
        }
        assert defaults[f"{role}_gpu_node"] == "{{ 'gpu_nodes' in group_names }}"


def test_hosts_outside_the_cluster_groups_are_not_nodes(tmp_path: Path) -> None:
    inventory = write(tmp_path, "[gpu_nodes]\nspare\n[control_plane]\ncp\n[workers]\nw\n")
    assert {n.name for n in read_nodes(inventory)} == {"cp", "w"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[workers]\nw\n", "must hold exactly one host .* found none"),
        ("[control_plane]\na\nb\n", r"found \['a', 'b'\]"),
    ],
)
def test_inventories_without_one_control_plane_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(InventoryError, match=message):
        read_nodes(write(tmp_path, text))


def test_missing_inventory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="Ansible inventory not found"):
        read_nodes(tmp_path / "nope.ini")


def test_api_server_url_brackets_ipv6(tmp_path: Path) -> None:
    nodes = read_nodes(write(tmp_path, "[control_plane]\ncp ansible_host=fd00::10\n[workers]\nw\n"))
    assert api_server_url(nodes) == "https://[fd00::10]:6443"
