"""GPUs reach the pods that request them, and only those, and CUDA works on them."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, fail_on
from tests.smoke.checks.layout import SmokeSettings
from tests.smoke.checks.pods import PodRun, cuda_pod_manifest, run_pod
from tests.smoke.checks.scheduling import (
    gpu_count,
    gpu_nodes,
    is_nvswitch_node,
    name,
    why_not_running,
)

pytestmark = pytest.mark.smoke
CUDA_HINT = (
    "CUDA_ERROR_SYSTEM_NOT_READY (802) on an NVSwitch system means NVIDIA Fabric Manager is not "
    "running or does not match the driver (`systemctl status nvidia-fabricmanager`); other errors: "
    "check the driver (`nvidia-smi` on the node) and that the container runtime is NVIDIA's"
)


P2P_HINT = (
    "its GPUs cannot reach each other over NVLink: check Fabric Manager "
    "(`systemctl status nvidia-fabricmanager`), `nvidia-smi topo -m` and "
    "`nvidia-smi nvlink --status` on the node"
)


def finished_problems(run: PodRun, what: str) -> list[str]:
    """Why a test pod did not run the CUDA program to its end, if it did not."""
    if run.problem:
        return [f"{run.describe()}: {run.problem}"]
    if run.result() is None:
        return [
            f"{run.describe()}: the CUDA program printed no result ({why_not_running(run.pod)}): "
            f"the container did not start, or {what} never ran"
        ]
    return []


def test_a_pod_requesting_one_gpu_runs_a_cuda_kernel(cuda_pod: PodRun) -> None:
    run = cuda_pod
    problems = finished_problems(run, "the program")
    if not problems and run.cuda_problems():
        problems.append(f"{'; '.join(run.cuda_problems())} in {run.describe()}: {CUDA_HINT}")
    elif not problems and (run.phase != "Succeeded" or run.exit_code != 0):
        problems.append(f"the CUDA program failed (exit code {run.exit_code}) in {run.describe()}")
    fail_on(problems, "A pod that requests one GPU cannot use exactly one with CUDA")


def test_a_pod_requesting_no_gpu_sees_none(no_gpu_pod: PodRun) -> None:
    run = no_gpu_pod
    problems = finished_problems(run, "the program")
    if not problems and run.gpu_uuids():
        problems.append(
            f"{len(run.gpu_uuids())} GPU(s) visible in {run.describe()}, which requested none but "
            "set NVIDIA_VISIBLE_DEVICES=all: configure the NVIDIA container toolkit with "
            "accept-nvidia-visible-devices-envvar-when-unprivileged = false and the device plugin "
            "with deviceListStrategy volume-mounts, so only allocated GPUs reach a container"
        )
    elif not problems and (run.phase != "Succeeded" or run.exit_code != 0):
        problems.append(
            f"the pod ended {run.phase} (exit code {run.exit_code}), not Succeeded, in "
            f"{run.describe()}: {'; '.join(run.cuda_problems()) or 'see its log'}"
        )
    fail_on(problems, "A pod that requests no GPU can use GPUs, or did not run")


def test_gpus_of_an_nvswitch_node_copy_peer_to_peer(
    cluster: Cluster, settings: SmokeSettings, smoke_namespace: str
) -> None:
    """On every NVSwitch node (p4d, p5...; --nvswitch-node for others), a pod holding all its GPUs
    copies between every pair of them directly, over NVLink."""
    nodes = [node for node in gpu_nodes(cluster) if is_nvswitch_node(node, settings)]
    if not nodes:
        pytest.skip(
            "no NVSwitch GPU node (instance types p4d, p4de, p5, p5e, p5en, p6; others: "
            "--nvswitch-node NAME)"
        )
    problems = []
    for node in nodes:
        gpus = gpu_count(node, "allocatable") or 0
        if gpus < 2:
            problems.append(
                f"{name(node)} offers no allocatable nvidia.com/gpu"
                if not gpus
                else f"{name(node)} offers only one allocatable GPU: nothing to copy between"
            )
            continue
        manifest = cuda_pod_manifest(
            f"gpu-smoke-p2p-{name(node)}"[:63].rstrip("-."),
            settings.image,
            ["--expect-devices", str(gpus), "--peer-to-peer"],
            gpus=gpus,
        )
        manifest["spec"]["nodeSelector"]["kubernetes.io/hostname"] = name(node)
        run = run_pod(
            cluster,
            smoke_namespace,
            manifest,
            keep_running=False,
            timeout=settings.pod_timeout_seconds,
        )
        unfinished = finished_problems(run, "the program")
        problems += unfinished
        if not unfinished and run.cuda_problems():
            hint = P2P_HINT if run.result_field("peer_to_peer") == "failed" else CUDA_HINT
            problems.append(f"{name(node)}: {'; '.join(run.cuda_problems())}: {hint}")
        cluster.delete(f"/api/v1/namespaces/{smoke_namespace}/pods/{run.name}")
    fail_on(problems, "GPUs of an NVSwitch node cannot copy to each other")
