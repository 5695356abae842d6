"""Shared and partitioned GPUs, where the cluster has them (stack config ``gpuSharing``).

- On a node whose device plugin runs migStrategy mixed (it offers ``nvidia.com/mig-<profile>``),
  a pod requesting one MIG device (``nvidia.com/mig-1g.10gb`` where offered, else the smallest
  profile there is) sees exactly that one.
- On a time-sliced node (GPU feature discovery's ``nvidia.com/gpu.sharing-strategy=time-slicing``
  with ``nvidia.com/gpu.replicas``), more pods than it has GPUs, each requesting one replica, all
  run, each sees one GPU, and two of them share one.

Each is skipped, saying so, on a cluster without such nodes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.smoke.checks.cluster import Cluster, fail_on
from tests.smoke.checks.layout import GPU_RESOURCE, SmokeSettings
from tests.smoke.checks.pods import DRIVER_CAPABILITIES, PodRun, pod_manifest, run_pod
from tests.smoke.checks.scheduling import gpu_nodes, labels, name

pytestmark = pytest.mark.smoke

MIG_PREFIX = "nvidia.com/mig-"
PREFERRED_MIG = f"{MIG_PREFIX}1g.10gb"
SHARED_RESOURCE = f"{GPU_RESOURCE}.shared"
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
REPLICAS = "nvidia.com/gpu.replicas"
GPU_COUNT = "nvidia.com/gpu.count"
PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")


def allocatable(node: dict[str, object]) -> dict[str, int]:
    """The node's allocatable NVIDIA devices (whole GPUs, MIG devices, shared GPUs) by resource."""
    status = node.get("status") or {}
    assert isinstance(status, dict)
    return {
        key: int(value)
        for key, value in (status.get("allocatable") or {}).items()
        if key.startswith("nvidia.com/")
    }


def _size(resource: str) -> tuple[int, int]:
    match = PROFILE.match(resource.removeprefix(MIG_PREFIX))
    return (int(match[1]), int(match[2])) if match else (99, 9999)


def mig_resource(cluster: Cluster) -> tuple[str, str] | None:
    """(resource, node) of a MIG device to request: 1g.10gb where offered, else the smallest."""
    offered = [
        (resource, name(node))
        for node in gpu_nodes(cluster)
        for resource, count in allocatable(node).items()
        if resource.startswith(MIG_PREFIX) and count > 0
    ]
    if not offered:
        return None
    preferred = [entry for entry in offered if entry[0] == PREFERRED_MIG]
    return (preferred or sorted(offered, key=lambda entry: _size(entry[0])))[0]


@pytest.fixture
def test_pods(cluster: Cluster, smoke_namespace: str) -> Iterator[list[PodRun]]:
    """Pods a check made; deleted after it."""
    made: list[PodRun] = []
    yield made
    for run in made:
        cluster.delete(f"/api/v1/namespaces/{smoke_namespace}/pods/{run.name}")


def test_a_pod_requesting_one_mig_device_sees_exactly_one(
    cluster: Cluster, smoke_namespace: str, settings: SmokeSettings, test_pods: list[PodRun]
) -> None:
    chosen = mig_resource(cluster)
    if chosen is None:
        pytest.skip(
            "no GPU node offers MIG devices (nvidia.com/mig-<profile>: a MIG layout and the "
            "device plugin's migStrategy mixed, see docs/sharing.md)"
        )
    resource, node = chosen
    profile = resource.removeprefix(MIG_PREFIX)
    manifest = pod_manifest(
        "gpu-smoke-mig",
        settings.image,
        ["nvidia-smi", "-L"],
        gpus=1,
        resource=resource,
        env=DRIVER_CAPABILITIES,  # utility: the toolkit mounts nvidia-smi
    )
    run = run_pod(
        cluster, smoke_namespace, manifest, keep_running=False, timeout=settings.pod_timeout_seconds
    )
    test_pods.append(run)
    problems = []
    if run.problem:
        problems.append(f"{run.describe()}: {run.problem}")
    elif run.phase != "Succeeded" or run.exit_code != 0:
        problems.append(
            f"nvidia-smi -L failed (exit code {run.exit_code}) in {run.describe()}: check the "
            "NVIDIA driver and that the device plugin hands out MIG devices (migStrategy mixed)"
        )
    else:
        devices = run.mig_devices()
        if len(devices) != 1 or devices[0][0] != profile:
            seen = ", ".join(p for p, _ in devices) or "none"
            problems.append(
                f"nvidia-smi -L listed {len(devices)} MIG device(s) ({seen}), not the one "
                f"{profile} requested as {resource} (offered on {node}), in {run.describe()}: "
                "the device plugin or the container runtime hands the pod more than its MIG "
                "device (deviceListStrategy volume-mounts, the toolkit's isolation settings)"
            )
    fail_on(problems, f"A pod requesting one {resource} does not see exactly one MIG device")


def time_sliced_node(cluster: Cluster) -> tuple[dict[str, object], int] | None:
    """A node GPU feature discovery labels time-sliced, and its replicas per GPU."""
    for node in gpu_nodes(cluster):
        node_labels = labels(node)
        if node_labels.get(SHARING_STRATEGY) == "time-slicing" and node_labels.get(REPLICAS):
            replicas = int(node_labels[REPLICAS])
            if replicas >= 2:
                return node, replicas
    return None


def test_two_pods_share_one_time_sliced_gpu(
    cluster: Cluster, smoke_namespace: str, settings: SmokeSettings, test_pods: list[PodRun]
) -> None:
    found = time_sliced_node(cluster)
    if found is None:
        pytest.skip(
            "no GPU node is time-sliced (nvidia.com/gpu.sharing-strategy=time-slicing with "
            "nvidia.com/gpu.replicas of 2 or more: a gpuSharing config with sharing time-slicing)"
        )
    node, replicas = found
    offered = allocatable(node)
    resource = SHARED_RESOURCE if SHARED_RESOURCE in offered else GPU_RESOURCE
    gpus = int(labels(node).get(GPU_COUNT) or max(1, offered.get(resource, 0) // replicas))
    # One pod more than the node has GPUs: if all run, two of them share a GPU.
    wanted = gpus + 1
    problems = []
    if offered.get(resource, 0) < wanted:
        problems.append(
            f"{name(node)} is labelled time-slicing with {replicas} replicas of its {gpus} "
            f"GPU(s), but offers {offered.get(resource, 0)} {resource}, fewer than the "
            f"{wanted} pods of this check: the device plugin did not apply the sharing config "
            "(its nvidia.com/device-plugin.config label, the config's name in gpuSharing, the "
            "plugin's config-manager log)"
        )
    command = ["sh", "-c", "nvidia-smi -L; exec sleep 3600"]
    for index in range(wanted):
        manifest = pod_manifest(
            f"gpu-smoke-shared-{index}",
            settings.image,
            command,
            gpus=1,
            resource=resource,
            node=name(node),
            env=DRIVER_CAPABILITIES,
        )
        run = run_pod(
            cluster,
            smoke_namespace,
            manifest,
            keep_running=True,
            timeout=settings.pod_timeout_seconds,
        )
        test_pods.append(run)
        if run.problem:
            problems.append(f"{run.describe()}: {run.problem}")
        elif len(run.listed_gpu_uuids()) != 1:
            problems.append(
                f"nvidia-smi -L listed {len(run.listed_gpu_uuids())} GPUs, not one replica's, in "
                f"{run.describe()}"
            )
    if not problems:
        shared = Counter(run.listed_gpu_uuids()[0] for run in test_pods)
        if max(shared.values()) < 2:
            problems.append(
                f"{wanted} pods on {name(node)} saw {len(shared)} different GPUs, none shared: "
                f"the node has more GPUs than nvidia.com/gpu.count says"
            )
    fail_on(problems, f"Pods do not share the time-sliced GPUs of {name(node)}")
