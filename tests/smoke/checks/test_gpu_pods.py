"""GPUs reach the pods that request them, and only those."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import fail_on
from tests.smoke.checks.pods import PodRun

pytestmark = pytest.mark.smoke


def test_a_pod_requesting_one_gpu_runs_nvidia_smi(nvidia_smi_pod: PodRun) -> None:
    run = nvidia_smi_pod
    problems = []
    if run.problem:
        problems.append(f"{run.describe()}: {run.problem}")
    elif run.phase != "Succeeded" or run.exit_code != 0:
        problems.append(
            f"nvidia-smi -L failed (exit code {run.exit_code}) in {run.describe()}: check the "
            "NVIDIA driver on the node and that the container runtime is NVIDIA's"
        )
    elif len(run.gpu_uuids()) != 1:
        problems.append(
            f"nvidia-smi -L listed {len(run.gpu_uuids())} GPUs, not the one requested, in "
            f"{run.describe()}: the device plugin hands the pod more than its share"
        )
    fail_on(problems, "A pod that requests one GPU cannot use exactly one")


def test_a_pod_requesting_no_gpu_sees_none(no_gpu_pod: PodRun) -> None:
    run = no_gpu_pod
    problems = []
    if run.problem:
        problems.append(f"{run.describe()}: {run.problem}")
    elif run.gpu_uuids():
        problems.append(
            f"nvidia-smi -L listed {len(run.gpu_uuids())} GPU(s) in {run.describe()}, which "
            "requested none but set NVIDIA_VISIBLE_DEVICES=all: configure the NVIDIA container "
            "toolkit with accept-nvidia-visible-devices-envvar-when-unprivileged = false and the "
            "device plugin with deviceListStrategy volume-mounts, so only allocated GPUs reach "
            "a container"
        )
    fail_on(problems, "A pod that requests no GPU can use GPUs")
