"""Before a run's first trial: its lock on the namespace (lock.py), the expired runs collected,
the namespace's guards made sure of (guards.py: the ResourceQuota, waited for until enforced,
and the PriorityClass), and the run's anchor ConfigMap created."""

from __future__ import annotations

from collections.abc import Callable

from profiler_app.trial import guards
from profiler_app.trial.cluster import ApiError, TrialCluster
from profiler_app.trial.collect import ANCHOR_PREFIX, EXPIRES_AT, collect_runs
from profiler_app.trial.guards import QUOTA_NAME
from profiler_app.trial.lock import NamespaceLock
from profiler_app.trial.manifests import MANAGED_BY, RUN_LABEL
from profiler_app.trial.plan import Plan
from profiler_app.trial.progress import Progress
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.run_state import Json, RunState


def prepare(
    plan: Plan,
    options: RunOptions,
    state: RunState,
    cluster: TrialCluster,
    lock: NamespaceLock,
    *,
    progress: Progress,
    clock: Callable[[], float],
    pause: Callable[[float], None],
) -> None:
    """Take the lock and set the namespace up; ``state`` gets the quota's GPUs and the anchor."""
    ns = options.namespace
    try:
        lock.acquire()  # one run at a time in the namespace
    except ApiError as error:
        if error.status != 404:  # 404: no such namespace yet
            raise
        cluster.ensure_namespace(ns)
        lock.acquire()
    for run in collect_runs(cluster, ns, clock(), keep=state.run_id):
        progress.event(f"collected the objects of expired run {run}")
    quota = cluster.get("ResourceQuota", ns, QUOTA_NAME)
    if quota is None:
        cluster.ensure_namespace(ns)
        quota = cluster.create(
            "ResourceQuota", ns, guards.quota_manifest(state.quota_gpus, options.parallel)
        )
        progress.event(f"namespace {ns}: ResourceQuota {QUOTA_NAME} of {state.quota_gpus} GPUs")
    else:
        state.quota_gpus = min(state.quota_gpus, guards.quota_gpus(quota, ns))
    if not (quota.get("status") or {}).get("hard"):
        waited = guards.wait_for_quota(cluster, ns, clock=clock, pause=pause, timeout=60.0)
        progress.event(f"the quota is enforced ({waited:.0f} s for its status)")
    if guards.ensure_priority_class(cluster, options.priority_class):
        progress.event(f"PriorityClass {options.priority_class} created")
    anchor = cluster.create("ConfigMap", ns, anchor_manifest(plan, options, state.run_id, clock()))
    state.anchor = anchor
    progress.event(f"run {state.run_id}: anchor ConfigMap {ns}/{anchor['metadata']['name']}")


def anchor_manifest(plan: Plan, options: RunOptions, run_id: str, now: float) -> Json:
    """The run's anchor: the trials' owner, and, past its expiry, the sign that the run is gone."""
    longest = options.per_trial_seconds * max(1, len(plan.trials))
    expires = now + longest + options.cleanup_timeout_seconds
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{ANCHOR_PREFIX}{run_id}",
            "labels": {RUN_LABEL: run_id, MANAGED_BY[0]: MANAGED_BY[1]},
            "annotations": {EXPIRES_AT: f"{expires:.0f}"},
        },
        "data": {"source": plan.source, "trials": str(len(plan.trials))},
    }
