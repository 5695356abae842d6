"""Between one trial and the next: knowing the previous one's fate, and its pods gone.

A create whose answer is lost (a timeout, a dropped connection) may still have gone through.
The runner then starts nothing else, and creates the same trial again: a 409 AlreadyExists on
the trial's own name means the first create went through, and the object is adopted when its
labels carry this run's id and the trial's name (``adopt``), else refused.

A deleted pod is not gone: it stays Terminating, holding its GPUs and counted by the quota,
until its containers exit or its grace period ends (kubernetes pkg/registry/core/pod/strategy.go,
``CheckGracefulDelete``; pkg/quota/v1/evaluator/core/pods.go, ``QuotaV1Pod``), and the garbage
collector deletes a Job's pods after the Job (pkg/controller/garbagecollector). An ended trial
is therefore ``Draining`` until its pods are gone; its GPUs and nodes stay taken meanwhile, and
the time it took is said and counted in its GPU time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profiler_app.trial.cluster import ApiError, TrialCluster
from profiler_app.trial.manifests import RUN_LABEL, TRIAL_LABEL

Json = dict[str, Any]


def adopt(cluster: TrialCluster, kind: str, namespace: str, name: str, run_id: str) -> Json:
    """The trial object a lost create made, checked to be this run's (ApiError 409 if not)."""
    found = cluster.get(kind, namespace, name)
    if found is None:
        raise ApiError(409, f"{kind} {namespace}/{name} already existed, then went away")
    labels = (found.get("metadata") or {}).get("labels") or {}
    if labels.get(RUN_LABEL) != run_id or labels.get(TRIAL_LABEL) != name:
        raise ApiError(
            409,
            f"{kind} {namespace}/{name} already exists and is not this run's (its run label "
            f"is {labels.get(RUN_LABEL)!r}); remove it, or run in another namespace",
        )
    return found


@dataclass
class Draining:
    """An ended trial whose pods may still hold GPUs."""

    index: int
    name: str
    gpus: int
    hostnames: tuple[str, ...]
    ended_at: float  # on the runner's clock


def pods_left(cluster: TrialCluster, namespace: str, trial: str) -> int:
    return len(cluster.list_of("Pod", namespace, {TRIAL_LABEL: trial}))
