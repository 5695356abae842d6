"""The pods the smoke suite runs on GPU nodes, and waiting for them.

Every GPU test pod targets GPU nodes (their label, and a toleration of their taint) so that the pod
that requests no GPU lands where GPUs are and could leak. That pod also sets
``NVIDIA_VISIBLE_DEVICES=all``, as CUDA images do in their environment: a container runtime that
honours the variable for unprivileged pods hands every GPU to any pod that asks.

The GPU pods run the CUDA program of cuda_check.py (its source, with ``python3 -c``), which ends
its log with one JSON line: the GPUs it saw, their UUIDs and what went wrong.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.gpu import gpu_node_selector, gpu_tolerations
from tests.smoke.checks.cluster import ApiError, Cluster, fail_on, poll_delays
from tests.smoke.checks.layout import GPU_RESOURCE, SMOKE_LABEL
from tests.smoke.checks.scheduling import is_ready, why_not_running

Json = dict[str, Any]
# `nvidia-smi -L`: "GPU 0: NVIDIA A10G (UUID: GPU-5e2f...)", one line per GPU it can see.
NVIDIA_SMI_GPU_LINE = re.compile(r"^GPU \d+: .+ \(UUID: (GPU-[0-9A-Fa-f-]+)\)\s*$", re.MULTILINE)
# Under its GPU's line, one per MIG device the container can use:
# "  MIG 1g.10gb     Device  0: (UUID: MIG-5e2f...)".
NVIDIA_SMI_MIG_LINE = re.compile(
    r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[0-9A-Za-z/-]+)\)\s*$", re.MULTILINE
)
HOLD_SECONDS = 3600  # a holder pod's sleep; activeDeadlineSeconds ends it if the suite dies
CUDA_CHECK_SOURCE = Path(__file__).with_name("cuda_check.py").read_text(encoding="utf-8")
# The toolkit mounts the driver's compute libraries only for this capability (CUDA images set it;
# the test image does not).
DRIVER_CAPABILITIES = {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}


def cuda_command(*arguments: str) -> list[str]:
    """The container command that runs the CUDA program with these arguments."""
    return ["python3", "-c", CUDA_CHECK_SOURCE, *arguments]


def pod_manifest(
    pod_name: str,
    image: str,
    command: list[str],
    *,
    gpus: int = 0,
    env: dict[str, str] | None = None,
    deadline_seconds: int = HOLD_SECONDS,
    on_gpu_nodes: bool = True,
    resource: str = GPU_RESOURCE,
    node: str | None = None,
) -> Json:
    """A one-container pod, on a GPU node (``node``, if given) unless told otherwise, restartPolicy
    Never, with ``gpus`` of ``resource`` (a MIG device or shared GPU resource, not whole GPUs)."""
    resources: Json = {}
    if gpus:
        resources = {"limits": {resource: str(gpus)}}
    container: Json = {
        "name": "main",
        "image": image,
        "command": command,
        "resources": resources,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if env:
        container["env"] = [{"name": key, "value": value} for key, value in env.items()]
    spec: Json = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_seconds,
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if on_gpu_nodes:
        spec |= {"nodeSelector": gpu_node_selector(), "tolerations": gpu_tolerations()}
    if node:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "labels": dict(SMOKE_LABEL)},
        "spec": spec,
    }


def cuda_pod_manifest(
    pod_name: str, image: str, arguments: list[str], *, gpus: int, env: dict[str, str] | None = None
) -> Json:
    """A pod on a GPU node running the CUDA program."""
    return pod_manifest(
        pod_name,
        image,
        cuda_command(*arguments),
        gpus=gpus,
        env={**DRIVER_CAPABILITIES, **(env or {})},
    )


@dataclass(frozen=True)
class PodRun:
    """What became of a test pod: its last state and its log, or why it never ran."""

    namespace: str
    pod: Json
    log: str
    problem: str | None  # None: it reached the awaited state

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def node(self) -> str | None:
        return self.pod.get("spec", {}).get("nodeName")

    @property
    def phase(self) -> str:
        return str(self.pod.get("status", {}).get("phase", "Unknown"))

    @property
    def exit_code(self) -> int | None:
        for container in self.pod.get("status", {}).get("containerStatuses") or []:
            ended = (container.get("state") or {}).get("terminated")
            if ended is not None:
                return int(ended.get("exitCode", -1))
        return None

    def result(self) -> Json | None:
        """The CUDA program's result: the last line of the log that is a JSON object."""
        for line in reversed(self.log.splitlines()):
            try:
                document = json.loads(line)
            except ValueError:
                continue
            if isinstance(document, dict):
                return document
        return None

    def result_field(self, key: str) -> Any:
        return (self.result() or {}).get(key)

    def gpu_uuids(self) -> list[str]:
        """The GPUs the CUDA program saw, by UUID (NVML's, which dcgm-exporter reports)."""
        return [str(uuid) for uuid in (self.result() or {}).get("uuids") or []]

    def cuda_problems(self) -> list[str]:
        return [str(problem) for problem in (self.result() or {}).get("problems") or []]

    def listed_gpu_uuids(self) -> list[str]:
        """The GPUs ``nvidia-smi -L`` listed in the pod's log."""
        return NVIDIA_SMI_GPU_LINE.findall(self.log)

    def mig_devices(self) -> list[tuple[str, str]]:
        """(profile, UUID) of the MIG devices ``nvidia-smi -L`` listed in the pod's log."""
        return NVIDIA_SMI_MIG_LINE.findall(self.log)

    def describe(self) -> str:
        where = f" on {self.node}" if self.node else ""
        log = " | ".join(line for line in self.log.splitlines() if line.strip()) or "(empty)"
        return f"pod {self.namespace}/{self.name}{where}, phase {self.phase}, log: {log[:500]}"


def require_running(run: PodRun) -> None:
    """Fail the check that needs ``run``'s pod running, saying why it is not."""
    if run.problem:
        fail_on([f"{run.describe()}: {run.problem}"], "No test pod holds a GPU")


def run_pod(
    cluster: Cluster, namespace: str, manifest: Json, *, keep_running: bool, timeout: float
) -> PodRun:
    """Create the pod and wait until it has finished (or, with ``keep_running``, is running and
    ready) or ``timeout`` passes; never raises for what the pod does, only for API failures."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    created = cluster.create(pods, manifest)
    path = f"{pods}/{created['metadata']['name']}"
    delays = poll_delays(time.monotonic() + timeout)
    while True:
        pod = cluster.get(path)
        phase = pod.get("status", {}).get("phase")
        finished = phase in ("Succeeded", "Failed")
        if finished or (keep_running and phase == "Running" and is_ready(pod)):
            problem = None
            if keep_running and finished:
                problem = f"ended ({phase}) instead of running: {why_not_running(pod)}"
            return PodRun(namespace, pod, _log(cluster, path), problem)
        delay = next(delays, None)
        if delay is None:
            wanted = "running" if keep_running else "finished"
            problem = f"not {wanted} after {timeout:.0f}s: {why_not_running(pod)}"
            return PodRun(namespace, pod, _log(cluster, path), problem)
        time.sleep(delay)


def _log(cluster: Cluster, pod_path: str) -> str:
    try:
        return cluster.text(f"{pod_path}/log")
    except ApiError as error:
        if error.status == 400:  # no container ever started: there is no log to read
            return ""
        raise
