"""Training pods protected from voluntary disruption (``run --protect-training``).

Karpenter never consolidates, drifts or expires a node away from under a pod annotated
``karpenter.sh/do-not-disrupt: "true"`` (https://karpenter.sh/docs/concepts/disruption/). The
profiler sets it on each GPU pod whose GPU it classifies as training (the GPU's current pod),
and removes it (null) once the pod stops training, so consolidation never evicts a running
training job yet reclaims the node as soon as the job is done. Idle, allocated-but-idle,
inference and bursty GPUs get no protection.

It changes only the annotation it owns: with it, it writes the marker ``<domain>/do-not-disrupt:
training``, and it removes ``karpenter.sh/do-not-disrupt`` only while that marker is there. A
do-not-disrupt annotation that anyone else set (no marker) is left alone for the pod's lifetime;
removing the marker hands the annotation over to whoever did.

Requests: one GET per GPU pod, the first time this process sees it (to learn who owns what it
carries, also after a restart), and one more before each removal (the marker may have been
taken away); one PATCH per change. Nothing while a pod stays as it is. A 404 means the pod is
gone: it is not tried again, and forgotten once the cycles no longer list it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import Enum

from profiler_app.analysis.basis import JobType
from profiler_app.kube import TRANSPORT_ERRORS, error_status
from profiler_app.model import CycleResult
from profiler_app.sinks.kubernetes.api import AnnotationApi
from profiler_app.sinks.kubernetes.changes import Patch

log = logging.getLogger(__name__)

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "do-not-disrupt"  # <domain>/do-not-disrupt: why the profiler set DO_NOT_DISRUPT
MARKER_VALUE = "training"

PodKey = tuple[str, str, datetime | None]  # namespace, name, start time: one pod's lifetime


class Holder(Enum):
    """Who holds the pod's do-not-disrupt annotation, as far as this process knows."""

    NOBODY = "nobody"
    PROFILER = "profiler"
    SOMEONE_ELSE = "someone else"
    GONE = "gone"  # the API answered 404: not tried again while the cycles still list it


def training_pods(result: CycleResult) -> set[tuple[str, str]]:
    """(namespace, pod) currently on a GPU classified as training."""
    return {
        (profile.namespace, profile.pod)
        for profile in result.gpus
        if profile.job_type == JobType.TRAINING and profile.namespace and profile.pod
    }


class TrainingProtector:
    """Keeps ``karpenter.sh/do-not-disrupt`` on the node's training pods, and only there."""

    def __init__(self, api: AnnotationApi, domain: str) -> None:
        self._api = api
        self._marker = f"{domain}/{MARKER}"
        self._holders: dict[PodKey, Holder] = {}

    def publish(self, result: CycleResult) -> None:
        training = training_pods(result)
        current: set[PodKey] = set()
        for usage in result.pods:
            if not usage.gpus:
                continue
            key = (usage.namespace, usage.pod, usage.start_time)
            current.add(key)
            self._sync(key, (usage.namespace, usage.pod) in training)
        # A protected pod that left the cycle's pods (it stopped using GPUs) loses protection.
        for key, holder in list(self._holders.items()):
            if key not in current and holder is Holder.PROFILER:
                self._sync(key, protect=False)
        self._holders = {key: h for key, h in self._holders.items() if key in current}

    def _sync(self, key: PodKey, protect: bool) -> None:
        holder = self._holders.get(key)
        if holder is None or (holder is Holder.PROFILER and not protect):
            holder = self._read(key)
        if protect and holder is Holder.NOBODY:
            holder = self._write(key, {DO_NOT_DISRUPT: "true", self._marker: MARKER_VALUE})
        elif not protect and holder is Holder.PROFILER:
            holder = self._write(key, {DO_NOT_DISRUPT: None, self._marker: None})
        self._holders[key] = holder

    def _read(self, key: PodKey) -> Holder:
        """Who holds the annotation on the server."""
        namespace, pod, _ = key
        try:
            annotations = self._api.pod_annotations(namespace, pod)
        except TRANSPORT_ERRORS as error:
            if error_status(error) != 404:
                raise
            return Holder.GONE
        if annotations.get(self._marker) is not None and DO_NOT_DISRUPT in annotations:
            return Holder.PROFILER
        if DO_NOT_DISRUPT in annotations:
            return Holder.SOMEONE_ELSE
        return Holder.NOBODY

    def _write(self, key: PodKey, patch: Patch) -> Holder:
        """Set (values) or remove (nulls) our annotation; who holds it after."""
        namespace, pod, _ = key
        try:
            self._api.patch_pod(namespace, pod, patch)
        except TRANSPORT_ERRORS as error:
            if error_status(error) != 404:
                raise
            return Holder.GONE
        protected = patch[DO_NOT_DISRUPT] is not None
        log.info(
            "%s %s on pod %s/%s: %s",
            "set" if protected else "removed",
            DO_NOT_DISRUPT,
            namespace,
            pod,
            "it trains" if protected else "it no longer trains",
        )
        return Holder.PROFILER if protected else Holder.NOBODY
