"""Annotations on the pods that use GPUs: one PATCH per pod whose values changed meaningfully.

What a pod should carry is ``desired(usage)`` (by default ``values.pod_annotations``); keys this
process wrote and no longer wants are removed with null. A 404 is churn (the pod was deleted
since the cycle looked): logged once, and the pod is not tried again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime

from profiler_app.core.kube import TRANSPORT_ERRORS, error_status
from profiler_app.core.model import PodUsage
from profiler_app.sinks.kubernetes.api import AnnotationApi
from profiler_app.sinks.kubernetes.changes import diff, significant_patch
from profiler_app.sinks.kubernetes.names import LEGACY_POD_NAMES
from profiler_app.sinks.kubernetes.values import Annotations, pod_annotations

log = logging.getLogger(__name__)

PodKey = tuple[str, str, datetime | None]  # namespace, name, start time: one pod's lifetime


class PodAnnotator:
    """Remembers what it wrote to each pod on the node; forgets pods that left."""

    def __init__(
        self,
        api: AnnotationApi,
        domain: str,
        desired: Callable[[PodUsage, str], Annotations] = pod_annotations,
    ) -> None:
        self._api = api
        self._domain = domain
        self._desired = desired
        self._known: dict[PodKey, Annotations] = {}
        self._missing: set[PodKey] = set()

    def publish(self, pods: Iterable[PodUsage]) -> None:
        current = set()
        for usage in pods:
            if not usage.gpus:
                continue
            key = (usage.namespace, usage.pod, usage.start_time)
            current.add(key)
            desired = self._desired(usage, self._domain)
            if key not in self._missing and self._write(key, usage, desired):
                self._known[key] = desired
        # Forget pods that left, so memory follows the pods on the node.
        self._known = {key: v for key, v in self._known.items() if key in current}
        self._missing &= current

    def _write(self, key: PodKey, usage: PodUsage, desired: Annotations) -> bool:
        """PATCH the pod if its values changed meaningfully; False when nothing was written."""
        # Not yet written by this process: an earlier version's keys may be there.
        legacy = {f"{self._domain}/{name}": "" for name in LEGACY_POD_NAMES}
        known = self._known.get(key, legacy)
        patch = diff(known, desired, known)
        if not significant_patch(known, patch):
            return False
        try:
            self._api.patch_pod(usage.namespace, usage.pod, patch)
        except TRANSPORT_ERRORS as error:
            if error_status(error) != 404:
                raise
            log.info("pod %s/%s is gone; not annotating it", usage.namespace, usage.pod)
            self._missing.add(key)
            return False
        return True
