"""Finding and deleting what runs left behind: each run's objects are owned by its anchor
ConfigMap, whose annotation says when the run is over for sure (its deadlines and cleanup
window passed). ``collect_runs`` deletes expired runs (the next run calls it, and
``trial clean``); ``remaining_objects`` lists what a run still has in the cluster.
"""

from __future__ import annotations

from profiler_app.trial.cluster import ApiError, TrialCluster
from profiler_app.trial.manifests import MANAGED_BY, PYTORCH_JOB, RUN_LABEL
from profiler_app.trial.status import rfc3339

ANCHOR_PREFIX = "trial-run-"
EXPIRES_AT = "ai.centaurus.io/trial-run-expires-at"
TRIAL_KINDS = ("Job", PYTORCH_JOB)


def found_runs(
    cluster: TrialCluster, namespace: str
) -> list[tuple[str, float | None, float | None]]:
    """(run id, created, expires) of every run anchor in the namespace (Unix seconds)."""
    try:
        anchors = cluster.list_of("ConfigMap", namespace, dict([MANAGED_BY]))
    except ApiError as error:
        if error.status == 404:
            return []
        raise
    found = []
    for anchor in anchors:
        metadata = anchor.get("metadata") or {}
        run = (metadata.get("labels") or {}).get(RUN_LABEL)
        if run:
            expires = (metadata.get("annotations") or {}).get(EXPIRES_AT)
            found.append(
                (
                    str(run),
                    rfc3339(metadata.get("creationTimestamp")),
                    float(expires) if expires else None,
                )
            )
    return sorted(found)


def collect_runs(
    cluster: TrialCluster,
    namespace: str,
    now: float,
    *,
    older_than: float | None = None,
    keep: str | None = None,
) -> list[str]:
    """Delete the runs whose anchor expired (or, with ``older_than``, was created at least that
    many seconds before ``now``), with what they own; returns their run ids."""
    collected = []
    for run, created, expires in found_runs(cluster, namespace):
        if run == keep:
            continue
        if older_than is not None:
            due = created is not None and now - created >= older_than
        else:
            due = expires is not None and now >= expires
        if due:
            delete_run(cluster, namespace, run)
            collected.append(run)
    return collected


def remaining_objects(cluster: TrialCluster, namespace: str, run_id: str) -> list[str]:
    """Objects of the run still in the cluster (trial objects, pods, the anchor)."""
    left = []
    for kind in (*TRIAL_KINDS, "Pod", "ConfigMap"):
        try:
            items = cluster.list_of(kind, namespace, {RUN_LABEL: run_id})
        except ApiError as error:
            if error.status == 404:  # no such resource (no training operator)
                continue
            raise
        left += [f"{kind} {namespace}/{item['metadata']['name']}" for item in items]
    return left


def delete_run(cluster: TrialCluster, namespace: str, run_id: str) -> None:
    """Delete a run's anchor and, in case the garbage collector lags, its objects."""
    cluster.delete("ConfigMap", namespace, f"{ANCHOR_PREFIX}{run_id}")
    for kind in TRIAL_KINDS:
        try:
            items = cluster.list_of(kind, namespace, {RUN_LABEL: run_id})
        except ApiError as error:
            if error.status == 404:
                continue
            raise
        for item in items:
            cluster.delete(kind, namespace, item["metadata"]["name"])
