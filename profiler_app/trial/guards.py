"""What a run makes sure of before its first trial: the namespace's ResourceQuota, enforced, and
a PriorityClass that cannot put trials above production.

The quota caps ``requests.nvidia.com/gpu`` and ``pods``, not ``count/pods``: the quota evaluator
(kubernetes pkg/quota/v1/evaluator/core/pods.go, ``PodUsageFunc``) charges ``count/pods`` for
every pod in storage, finished ones included, while ``pods`` and the GPUs are charged only for
pods that have not ended (a Terminating pod until its grace period ends). A new quota is
enforced only once the quota controller has filled its ``status``: until then admission refuses
every create it covers with 403 "status unknown for quota" (k8s.io/apiserver
pkg/admission/plugin/resourcequota/controller.go), so the run waits for that status.

The PriorityClass the runner creates has value -100 and ``preemptionPolicy: Never``. One that
already exists is refused when its value is above 0 (the default of pods without a class), when
it may preempt, or when it is the cluster's default; one that cannot be read (403) is refused
too, as nothing could be checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profiler_app.trial.cluster import ApiError, TrialCluster
from profiler_app.trial.manifests import MANAGED_BY

Json = dict[str, Any]
QUOTA_NAME = "gpu-profiler-trials"
PRIORITY_VALUE = -100  # below every default (0): production pods go first
DEFAULT_PRIORITY = 0  # what a pod without a PriorityClass gets
GPU_QUOTA = "requests.nvidia.com/gpu"


class GuardError(Exception):
    """A guard the run needs is missing or unsafe; the message says what to do."""


def quota_manifest(gpus: int, parallel: int) -> Json:
    objects = str(2 * max(1, parallel) + 2)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA_NAME, "labels": dict([MANAGED_BY])},
        "spec": {
            "hard": {
                GPU_QUOTA: str(gpus),
                "pods": str(gpus),  # pods not yet ended; see the module docstring
                "count/jobs.batch": objects,
                "count/pytorchjobs.kubeflow.org": objects,
                "count/configmaps": "16",
            }
        },
    }


def quota_gpus(quota: Json, namespace: str) -> int:
    hard = (quota.get("spec") or {}).get("hard") or {}
    try:
        return int(str(hard[GPU_QUOTA]))
    except (KeyError, ValueError):
        raise GuardError(f"ResourceQuota {namespace}/{QUOTA_NAME} sets no {GPU_QUOTA}") from None


def wait_for_quota(
    cluster: TrialCluster,
    namespace: str,
    *,
    clock: Callable[[], float],
    pause: Callable[[float], None],
    timeout: float,
) -> float:
    """Wait until the quota controller has filled the quota's status; the seconds waited."""
    start = clock()
    while True:
        quota = cluster.get("ResourceQuota", namespace, QUOTA_NAME) or {}
        if (quota.get("status") or {}).get("hard"):
            return clock() - start
        if clock() - start >= timeout:
            raise GuardError(
                f"ResourceQuota {namespace}/{QUOTA_NAME} has no status after {timeout:.0f} s: "
                "is the quota controller of kube-controller-manager running?"
            )
        pause(1.0)


def priority_class_manifest(name: str) -> Json:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": dict([MANAGED_BY])},
        "value": PRIORITY_VALUE,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "gpu-profiler trials: below production, never preempting",
    }


def ensure_priority_class(cluster: TrialCluster, name: str) -> bool:
    """Create the class, or check the one that exists; True when it was created."""
    try:
        found = cluster.priority_class(name)
    except ApiError as error:
        if error.status != 403:
            raise
        raise GuardError(
            f"cannot read PriorityClass {name} (HTTP 403: no permission to get "
            "priorityclasses.scheduling.k8s.io): a trial's priority cannot be checked; grant "
            "get on it, or give the TrialRunner's service account"
        ) from None
    if found is None:
        cluster.create_priority_class(priority_class_manifest(name))
        return True
    problem = priority_class_problem(found)
    if problem:
        raise GuardError(f"PriorityClass {name} {problem}; delete it and the run creates its own")
    return False


def priority_class_problem(found: Json) -> str | None:
    """Why an existing class would let trials displace production, or None."""
    try:
        value = int(found.get("value", 0))
    except (TypeError, ValueError):
        value = DEFAULT_PRIORITY + 1
    policy = found.get("preemptionPolicy") or "PreemptLowerPriority"  # the API's default
    if value > DEFAULT_PRIORITY:
        return (
            f"has value {found.get('value')}, above the {DEFAULT_PRIORITY} of pods without a "
            "class: trials would outrank production"
        )
    if policy != "Never":
        return f"may preempt pods (preemptionPolicy {policy}); trials need Never"
    if found.get("globalDefault"):
        return "is the cluster's default: every pod without a class would get a trial's priority"
    return None
