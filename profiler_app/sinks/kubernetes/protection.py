"""Training pods protected from voluntary disruption (``run --protect-training``).

Karpenter's graceful disruption (consolidation, drift) leaves a node alone while a pod on it
carries ``karpenter.sh/do-not-disrupt: "true"``; forceful disruption (expiration, interruption)
does not wait for it (https://karpenter.sh/docs/concepts/disruption/). The profiler sets it on
the GPU pods of its own node that train, with the marker ``<domain>/do-not-disrupt`` saying why
(``training`` or ``owner``), and removes both once they stop. The rules
(docs/daemon.md, "Protecting training from consolidation"):

- Only pods the pod watcher lists on this node (``CycleResult.node_pods``): nothing while its
  first list has not come, and never a pod of the same name on another node.
- A pod is wanted protected while its GPU is classified ``training`` (mark ``training``), and,
  before its GPUs have been classified over one whole window, while its workload is a training
  kind with a GPU request (mark ``owner``; ``workloads.TRAINING_KINDS``). Otherwise, and once it
  has finished, it is not.
- The annotation is the profiler's only while the marker is there and the value is "true". A
  do-not-disrupt anyone else set (no marker, or another value) is never changed; a marker
  beside someone else's value is removed alone.
- Every write follows a fresh read (GET) of the pod, checked for the watcher's UID and this
  node, and carries preconditions, so a change since that read fails the PATCH instead of being
  overwritten: setting is a strategic merge carrying ``metadata.resourceVersion`` and
  ``metadata.uid`` (409 Conflict when the pod changed since, which a pod recreated under the
  same name has too); changing or removing is a JSON patch that first ``test``s the UID and the
  values read (422 when they moved). A failed precondition is read again and retried, at most
  ``conflict_retries`` times a cycle.
- Each pod is its own attempt: one whose read or write fails waits out its own back-off while
  the others go on (``TrainingProtector``).
- Without GPU series (``CycleResult.gpus_read`` False: the metrics source failed) there is no
  verdict: the profiler's marks stay, owner-based protection and releases of finished pods go on.
- "Uses GPUs" is ``PodInfo.uses_gpus``: any GPU resource (``profiler_app.core.gpu_resources``).

Requests: none while the watcher shows every pod as wanted; a GET and a PATCH per change.
``release_all`` (``gpu-profiler unprotect``) removes every mark of the profiler's, cluster-wide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from profiler_app.analysis.basis import JobType
from profiler_app.core.annotations import DEFAULT_DOMAIN, validate_domain
from profiler_app.core.backoff import MAX_BACKOFF_INTERVALS, Backoff
from profiler_app.core.errors import ItemsFailedError
from profiler_app.core.kube import (
    TRANSPORT_ERRORS,
    KubeConnection,
    describe,
    error_status,
    retry_after_seconds,
)
from profiler_app.core.model import CycleResult, PodInfo
from profiler_app.profiles.workloads import TRAINING_KINDS, workload_from_owner
from profiler_app.sinks.kubernetes.api import JSON_PATCH, STRATEGIC_MERGE_PATCH, PodApi

log = logging.getLogger(__name__)

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "do-not-disrupt"  # <domain>/do-not-disrupt: why the profiler set DO_NOT_DISRUPT
TRAINING = "training"  # the classifier says the pod's GPU trains
OWNER = "owner"  # its workload is a training kind, its GPUs not yet classified for a window
PROTECTED = "true"


class Change(Enum):
    """What a pod's annotations need, given what they are and what is wanted."""

    PROTECT = "set do-not-disrupt and the marker"
    REMARK = "change the marker"
    RELEASE = "remove do-not-disrupt and the marker"
    UNMARK = "remove the marker alone"


def marker_key(domain: str) -> str:
    return f"{domain}/{MARKER}"


def watched_annotations(domain: str) -> tuple[str, str]:
    """The annotations the pod watcher keeps of each pod for the protector."""
    return DO_NOT_DISRUPT, marker_key(domain)


def needed_change(annotations: Mapping[str, str], marker: str, wanted: str | None) -> Change | None:
    """The change that turns ``annotations`` into what ``wanted`` (a mark, or None for no
    protection) calls for without touching anyone else's do-not-disrupt."""
    value, mark = annotations.get(DO_NOT_DISRUPT), annotations.get(marker)
    ours = mark is not None and value == PROTECTED
    if wanted is not None and value is None:
        return Change.PROTECT
    if wanted is not None and ours:
        return Change.REMARK if mark != wanted else None
    if ours:
        return Change.RELEASE
    return Change.UNMARK if mark is not None else None


def training_pods(result: CycleResult) -> set[tuple[str, str]]:
    """(namespace, pod) currently on a GPU classified as training."""
    return {
        (profile.namespace, profile.pod)
        for profile in result.gpus
        if profile.job_type == JobType.TRAINING and profile.namespace and profile.pod
    }


def wanted_mark(
    pod: PodInfo,
    training: set[tuple[str, str]] | None,
    judged_since: datetime,
    current: str | None = None,
) -> str | None:
    """The mark ``pod`` should carry, or None: the classifier's verdict once the pod's GPUs
    have been classified over a whole window (it started before ``judged_since``), and its
    owner's kind before. ``training`` None: no verdict this cycle (the GPU series were not
    read), so the profiler's ``current`` mark stays; a finished pod is released all the same."""
    if pod.finished or not pod.uses_gpus:
        return None
    if training is None and current is not None:
        return current
    if training is not None and (pod.namespace, pod.name) in training:
        return TRAINING
    judged = pod.start_time is not None and pod.start_time <= judged_since
    workload = workload_from_owner(pod.owner_kind, pod.owner_name, pod.labels)
    if not judged and workload is not None and workload.kind in TRAINING_KINDS:
        return OWNER
    return None


@dataclass(frozen=True)
class PodRead:
    """A pod as a GET returned it: what a guarded write needs."""

    uid: str
    node: str
    resource_version: str
    annotations: dict[str, str]

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> PodRead:
        metadata = document.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        return cls(
            uid=str(metadata.get("uid") or ""),
            node=str((document.get("spec") or {}).get("nodeName") or ""),
            resource_version=str(metadata.get("resourceVersion") or ""),
            annotations={str(key): str(value) for key, value in annotations.items()},
        )


def _pointer(key: str) -> str:
    """The JSON pointer of one annotation (RFC 6901 escapes ~ and /)."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def guarded_patch(
    read: PodRead, marker: str, change: Change, wanted: str | None
) -> tuple[object, str]:
    """The PATCH body and its content type for ``change``, with preconditions on what was
    read: the server refuses it if the pod changed since (409 or 422)."""
    if change is Change.PROTECT:
        metadata = {
            "uid": read.uid,
            "resourceVersion": read.resource_version,
            "annotations": {DO_NOT_DISRUPT: PROTECTED, marker: wanted},
        }
        return {"metadata": metadata}, STRATEGIC_MERGE_PATCH
    operations: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": read.uid},
        {"op": "test", "path": _pointer(marker), "value": read.annotations[marker]},
    ]
    if change is Change.REMARK:
        operations += [
            {"op": "test", "path": _pointer(DO_NOT_DISRUPT), "value": PROTECTED},
            {"op": "replace", "path": _pointer(marker), "value": wanted},
        ]
    elif change is Change.RELEASE:
        operations += [
            {"op": "test", "path": _pointer(DO_NOT_DISRUPT), "value": PROTECTED},
            {"op": "remove", "path": _pointer(DO_NOT_DISRUPT)},
            {"op": "remove", "path": _pointer(marker)},
        ]
    else:
        operations.append({"op": "remove", "path": _pointer(marker)})
    return operations, JSON_PATCH


def _server_wide(error: BaseException) -> bool:
    """A failure of the API server itself (down, slow, throttling), not of one pod."""
    status = error_status(error)
    return status is None or status == 429 or status >= 500


class Converger:
    """Brings one pod's annotations to what is wanted: read, decide, guarded write."""

    def __init__(
        self, connection: KubeConnection, domain: str, *, conflict_retries: int = 2
    ) -> None:
        self._api = PodApi(connection)
        self.marker = marker_key(domain)
        self._retries = conflict_retries

    def converge(self, pod: PodInfo, wanted: str | None, node: str | None) -> Change | None:
        """What was changed on ``pod`` (None: nothing needed, or it is gone, replaced, not on
        ``node``, or kept changing). Raises one of TRANSPORT_ERRORS for other failures."""
        where = f"pod {pod.namespace}/{pod.name}"
        for attempt in range(self._retries + 1):
            document = self._api.get(pod.namespace, pod.name)
            if document is None:
                return None
            read = PodRead.of(document)
            if read.uid != pod.uid or (node is not None and read.node != node):
                log.debug("%s is another pod now (recreated or moved); leaving it", where)
                return None
            change = needed_change(read.annotations, self.marker, wanted)
            if change is None:
                return None
            body, content_type = guarded_patch(read, self.marker, change, wanted)
            try:
                self._api.patch(pod.namespace, pod.name, body, content_type)
            except TRANSPORT_ERRORS as error:
                status = error_status(error)
                if status == 404:
                    return None
                if status not in (409, 422):
                    raise
                log.debug(
                    "%s changed since it was read (HTTP %s), attempt %d", where, status, attempt
                )
                continue
            return change
        log.info("%s kept changing while being patched; the next cycle tries again", where)
        return None


class PodsUnprotectedError(ItemsFailedError):
    """Some pods could not be brought to what is wanted; the others were. Each failing pod
    waits out its own back-off, so the daemon does not back the sink off."""

    def __init__(self, failing: Mapping[str, str], attempts: int) -> None:
        pods = ", ".join(f"{pod} ({why})" for pod, why in sorted(failing.items()))
        super().__init__(f"protecting {len(failing)} pod(s) failed: {pods}", failing, attempts)


@dataclass
class _Failing:
    """One pod whose last attempt failed: its own back-off, and why."""

    backoff: Backoff
    reason: str = ""


class TrainingProtector:
    """Sink keeping ``karpenter.sh/do-not-disrupt`` on this node's training pods, and only
    there. ``release_only``: protect nothing, remove what the profiler set (the DaemonSet's
    mode once the option is turned off).

    Each pod is its own attempt: a pod whose read or write fails (a 403, a 5xx from a webhook
    of its namespace, a 429, a timeout) waits out a back-off of its own (``interval_seconds``,
    doubling up to ``MAX_BACKOFF_INTERVALS`` of them, at least the server's Retry-After) while
    the other pods go on; ``PodsUnprotectedError`` names the failing ones after each cycle."""

    name = "protection"
    acts_without_metrics = True  # owner-based protection needs the pod list alone

    def __init__(
        self,
        connection: KubeConnection,
        node: str,
        *,
        domain: str = DEFAULT_DOMAIN,
        release_only: bool = False,
        conflict_retries: int = 2,
        interval_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self._release_only = release_only
        self._converger = Converger(
            connection, validate_domain(domain), conflict_retries=conflict_retries
        )
        self._interval = interval_seconds
        self._clock = clock
        self._failing: dict[tuple[str, str], _Failing] = {}  # by (uid, "namespace/name")

    def publish(self, result: CycleResult) -> None:
        if result.node_pods is None:  # Kubernetes has not listed the node's pods yet
            return
        # No GPU series this cycle (the metrics source failed): no verdict either way, so the
        # profiler's marks stay; owner-based protection and releases go on.
        training = training_pods(result) if result.gpus_read else None
        judged_since = result.at - timedelta(seconds=result.window_seconds)
        attempts = 0
        listed = set()
        for pod in result.node_pods:
            if pod.node != self.node:
                continue
            key = (pod.uid, f"{pod.namespace}/{pod.name}")
            listed.add(key)
            wanted = None
            if not self._release_only:
                wanted = wanted_mark(pod, training, judged_since, self._mark_of(pod))
            if needed_change(pod.annotations, self._converger.marker, wanted) is None:
                self._recovered(key)
                continue  # as the watcher sees it: no request
            failing = self._failing.get(key)
            if failing is not None and not failing.backoff.ready():
                continue  # waiting out this pod's own back-off
            started = self._clock()
            try:
                change = self._converger.converge(pod, wanted, self.node)
            except TRANSPORT_ERRORS as error:
                attempts += 1
                self._failed(key, error, started)
                continue
            self._recovered(key)
            if change is not None:
                _log_change(pod, change, wanted, self._release_only)
        for key in set(self._failing) - listed:  # gone from the node: nothing left to do
            del self._failing[key]
        if self._failing:
            failing_pods = {pod: failing.reason for (_, pod), failing in self._failing.items()}
            raise PodsUnprotectedError(failing_pods, attempts)

    def _mark_of(self, pod: PodInfo) -> str | None:
        """The profiler's mark on ``pod`` as the watcher sees it (None: not the profiler's)."""
        mark = pod.annotations.get(self._converger.marker)
        return mark if pod.annotations.get(DO_NOT_DISRUPT) == PROTECTED else None

    def _failed(self, key: tuple[str, str], error: BaseException, started: float) -> None:
        failing = self._failing.get(key)
        if failing is None:
            maximum = MAX_BACKOFF_INTERVALS * self._interval
            failing = _Failing(Backoff(self._interval, maximum, self._clock))
            self._failing[key] = failing
        delay = failing.backoff.failed(retry_after_seconds(error), since=started)
        failing.reason = f"{describe(error)}, {failing.backoff.failures} in a row"
        log.warning(
            "protecting pod %s failed (%s); the other pods go on, this one is tried again in %gs",
            key[1],
            describe(error),
            delay,
        )

    def _recovered(self, key: tuple[str, str]) -> None:
        failing = self._failing.pop(key, None)
        if failing is not None:
            log.info(
                "protecting pod %s works again after %d failure(s)",
                key[1],
                failing.backoff.failures,
            )

    def close(self) -> None:
        """Nothing to release: the caller owns the connection."""


def _log_change(pod: PodInfo, change: Change, wanted: str | None, release_only: bool) -> None:
    where = f"pod {pod.namespace}/{pod.name}"
    if change is Change.PROTECT:
        why = "it trains" if wanted == TRAINING else "its workload trains (not yet classified)"
        log.info("set %s on %s: %s", DO_NOT_DISRUPT, where, why)
    elif change is Change.REMARK:
        log.info("%s keeps %s: marked %s now", where, DO_NOT_DISRUPT, wanted)
    elif change is Change.RELEASE:
        why = "protection is being released" if release_only else "it no longer trains"
        if pod.finished:
            why = "it has finished"
        log.info("removed %s from %s: %s", DO_NOT_DISRUPT, where, why)
    else:
        log.info(
            "removed the profiler's marker from %s: the %s there is not its", where, DO_NOT_DISRUPT
        )


@dataclass(frozen=True)
class Released:
    """What ``release_all`` did (or, in a dry run, would do) to one pod."""

    pod: PodInfo
    change: Change | None  # None: nothing after all (it changed meanwhile, or is gone)
    error: str | None = None


def release_all(
    connection: KubeConnection,
    pods: Iterable[PodInfo],
    *,
    domain: str = DEFAULT_DOMAIN,
    dry_run: bool = False,
    report: Callable[[Released], None] = lambda released: None,
) -> list[Released]:
    """Removes the profiler's marks from ``pods`` (listed with the do-not-disrupt and marker
    annotations): ``gpu-profiler unprotect``. Every pod is tried; failures are reported, not
    raised, except a failure of the API server itself."""
    converger = Converger(connection, validate_domain(domain))
    done = []
    for pod in pods:
        change = needed_change(pod.annotations, converger.marker, None)
        if change is None:
            continue
        if dry_run:
            released = Released(pod, change)
        else:
            try:
                released = Released(pod, converger.converge(pod, None, node=None))
            except TRANSPORT_ERRORS as error:
                if _server_wide(error):
                    raise
                released = Released(pod, change, describe(error))
        report(released)
        done.append(released)
    return done
