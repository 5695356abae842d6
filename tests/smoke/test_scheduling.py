"""The smoke suite's reading of why a pod does or does not land on a node (checks/scheduling.py),
on real upstream objects: the NVIDIA device plugin chart's own node affinity at the pinned
version, and the tolerations infra/ gives the GPU DaemonSets."""

from __future__ import annotations

import tarfile
from typing import Any

import pytest
import yaml

from infra import versions
from infra.chart_cache import cached_archive
from infra.gpu import gpu_node_selector, gpu_tolerations
from tests.smoke.checks.scheduling import (
    affinity_mismatch,
    untolerated_taints,
    why_not_placed,
    why_not_running,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels}, "spec": {"taints": taints}}


@pytest.fixture(scope="module")
def device_plugin_affinity() -> dict[str, Any]:
    chart = versions.NVIDIA_DEVICE_PLUGIN
    archive = cached_archive(chart)
    if not archive.exists():
        pytest.skip(f"chart cache {archive.parent} lacks {archive.name}: run `--pull-charts`")
    with tarfile.open(archive) as bundle:
        member = bundle.extractfile(f"{chart.name}/values.yaml")
        assert member is not None
        values = yaml.safe_load(member.read())
    affinity: dict[str, Any] = values["affinity"]
    return affinity


def test_the_device_plugin_charts_affinity_admits_nodes_with_the_gpu_label(
    device_plugin_affinity: dict[str, Any],
) -> None:
    assert affinity_mismatch(node(gpu_node_selector(), []), device_plugin_affinity) is None
    reason = affinity_mismatch(node({"kubernetes.io/os": "linux"}, []), device_plugin_affinity)
    assert reason is not None
    assert "nvidia.com/gpu.present In ['true']" in reason


def test_gpu_tolerations_admit_the_gpu_taint_and_nothing_else() -> None:
    maintenance = {"key": "example.com/maintenance", "value": "true", "effect": "NoExecute"}
    preferred = {"key": "example.com/spot", "value": "true", "effect": "PreferNoSchedule"}
    tainted = node(gpu_node_selector(), [GPU_TAINT, maintenance, preferred])
    assert untolerated_taints(tainted, gpu_tolerations()) == [maintenance]
    assert untolerated_taints(tainted, []) == [GPU_TAINT, maintenance]
    everything = [{"operator": "Exists"}]
    assert untolerated_taints(tainted, everything) == []


def test_daemon_sets_tolerate_node_condition_taints_by_themselves() -> None:
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
    assert untolerated_taints(node({}, [not_ready]), [], daemon_set=True) == []
    assert untolerated_taints(node({}, [not_ready]), []) == [not_ready]


def test_why_not_placed_names_every_obstacle() -> None:
    spec = {"nodeSelector": gpu_node_selector(), "tolerations": []}
    reasons = why_not_placed(node({}, [GPU_TAINT]), spec, daemon_set=True)
    assert reasons == [
        "taint nvidia.com/gpu=present:NoSchedule is not tolerated (remove it from the node, or "
        "add a toleration)",
        "it lacks the label(s) nvidia.com/gpu.present=true of the nodeSelector",
    ]


def test_why_not_running_reads_scheduler_and_kubelet_status() -> None:
    pending = {
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "message": "0/3 nodes are available"}
            ],
        }
    }
    assert why_not_running(pending) == "not scheduled: 0/3 nodes are available"
    crashing = {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "exporter",
                    "ready": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                }
            ],
        }
    }
    assert why_not_running(crashing) == "container exporter waiting: CrashLoopBackOff (back-off)"
