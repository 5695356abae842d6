"""After a run, however it ended: every trial it created and its anchor deleted, retried while
the API server is away, and its lock released once nothing of it is left."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from profiler_app.trial.cluster import ApiError, TrialCluster, UnavailableError
from profiler_app.trial.collect import remaining_objects
from profiler_app.trial.lock import NamespaceLock
from profiler_app.trial.progress import Progress
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.run_state import RunState

log = logging.getLogger(__name__)


def clean_up(
    state: RunState,
    options: RunOptions,
    cluster: TrialCluster,
    lock: NamespaceLock,
    *,
    progress: Progress,
    clock: Callable[[], float],
    wait: Callable[[float], None],
) -> list[str]:
    """Delete what the run created and release its lock; what is left is returned (the Lease
    then expires on its own, after the leftovers)."""
    leftovers = _delete_created(state, options, cluster, progress=progress, clock=clock, wait=wait)
    if not leftovers:
        with contextlib.suppress(UnavailableError, ApiError):
            lock.release()
    return leftovers


def _delete_created(
    state: RunState,
    options: RunOptions,
    cluster: TrialCluster,
    *,
    progress: Progress,
    clock: Callable[[], float],
    wait: Callable[[float], None],
) -> list[str]:
    """Delete every trial and the anchor; wait until their pods are gone. What could not be
    deleted within ``cleanup_timeout`` is returned (its deadline still ends it)."""
    ns = options.namespace
    deadline = clock() + options.cleanup_timeout_seconds
    pending = list(dict.fromkeys(state.created))
    if state.anchor is not None:
        pending.append(("ConfigMap", state.anchor["metadata"]["name"]))
    said = False
    while clock() < deadline:
        try:
            for kind, name in list(pending):
                cluster.delete(kind, ns, name)
                pending.remove((kind, name))
            if not pending and state.anchor is None:
                return []
            remaining = remaining_objects(cluster, ns, state.run_id)
            if not pending and not remaining:
                progress.event(f"run {state.run_id}: every object it created is deleted")
                return []
        except UnavailableError as error:
            if not said:
                progress.event(f"cleanup waits for the API server ({error})")
                said = True
        except ApiError as error:
            log.warning("cleanup: %s", error)
        wait(min(options.poll_seconds, 5.0))
    left = [f"{kind} {ns}/{name}" for kind, name in pending]
    with contextlib.suppress(UnavailableError, ApiError):
        left += remaining_objects(cluster, ns, state.run_id)
    return sorted(set(left))
