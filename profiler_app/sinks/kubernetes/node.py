"""The node's annotations: written when they change meaningfully, and with each heartbeat.

The first cycle reads the node once (GET) to learn what an earlier run left. ``profiled-at`` is
not a change by itself: it is written with every real change and, as a heartbeat, at least every
``heartbeat_seconds``, so "profiled-at is old" means "the profiler is down or stuck". The
heartbeat re-reads the node first (GET + PATCH), so annotations edited by hand are repaired.
A 404 for the node is a configuration problem (wrong --node): logged once, raised every time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from profiler_app.core.kube import TRANSPORT_ERRORS, KubernetesError, error_status
from profiler_app.core.model import CycleResult
from profiler_app.sinks.kubernetes.api import AnnotationApi
from profiler_app.sinks.kubernetes.changes import diff, significant_patch
from profiler_app.sinks.kubernetes.names import (
    ANNOTATION_BUDGET_BYTES,
    PROFILED_AT,
    owned_node_key,
)
from profiler_app.sinks.kubernetes.values import Annotations, annotation_bytes, node_annotations

log = logging.getLogger(__name__)


class NodeAnnotator:
    """Keeps our keys on one node current, remembering what the server holds."""

    def __init__(
        self,
        api: AnnotationApi,
        node: str,
        domain: str,
        *,
        heartbeat_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self._api = api
        self.node = node
        self._domain = domain
        self._stamp_key = f"{domain}/{PROFILED_AT}"
        self._owned = owned_node_key(domain)
        self._heartbeat = heartbeat_seconds
        self._clock = clock
        self._known: Annotations | None = None  # our keys as on the server; None: unknown
        self._written_at: float | None = None
        self._missing = False

    def publish(self, result: CycleResult) -> None:
        desired = node_annotations(result, self._domain)
        if annotation_bytes(desired) > ANNOTATION_BUDGET_BYTES:
            raise KubernetesError(
                f"node annotations would take {annotation_bytes(desired)} bytes, "
                f"over the {ANNOTATION_BUDGET_BYTES}-byte budget"
            )
        resync_due = (
            self._written_at is not None and self._clock() - self._written_at >= self._heartbeat
        )
        try:
            if self._known is None or resync_due:
                # First use, and with each heartbeat: edits made by hand are repaired.
                self._known = self._read()
            known = self._known
            patch = diff(known, desired, [key for key in known if key != self._stamp_key])
            patch.pop(self._stamp_key, None)
            due = resync_due or self._written_at is None
            if not due and not significant_patch(known, patch):
                return
            patch[self._stamp_key] = desired[self._stamp_key]
            self._api.patch_node(self.node, patch)
        except TRANSPORT_ERRORS as error:
            if error_status(error) != 404:
                raise
            self._known = None
            if not self._missing:
                log.warning("node %s not found in the API; check --node / NODE_NAME", self.node)
            self._missing = True
            raise KubernetesError(f"node {self.node} not found in the Kubernetes API") from None
        self._missing = False
        self._known = {key: value for key, value in {**known, **patch}.items() if value is not None}
        self._written_at = self._clock()

    def _read(self) -> Annotations:
        """Our keys on the node as the server has them."""
        return {
            str(key): str(value)
            for key, value in self._api.node_annotations(self.node).items()
            if self._owned.match(str(key))
        }
