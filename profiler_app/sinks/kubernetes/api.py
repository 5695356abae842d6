"""The API calls the sinks make: read a node's annotations or a pod, PATCH an object."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from profiler_app.core.kube import TRANSPORT_ERRORS, KubeConnection, error_status, release
from profiler_app.sinks.kubernetes.changes import Patch

log = logging.getLogger(__name__)

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"  # RFC 6902: its `test` operations are preconditions
NODE_PATH = "/api/v1/nodes/{name}"
POD_PATH = "/api/v1/namespaces/{namespace}/pods/{name}"


class AnnotationApi:
    """Annotation reads and writes; a 409 Conflict is retried ``conflict_retries`` times, any
    other failure raises one of ``kube.TRANSPORT_ERRORS`` for the caller to judge."""

    def __init__(self, connection: KubeConnection, *, conflict_retries: int = 2) -> None:
        self._connection = connection
        self._conflict_retries = conflict_retries

    def node_annotations(self, node: str) -> dict[str, Any]:
        """The node's annotations as the server has them (all of them, not only ours)."""
        document = self._connection.get_json(NODE_PATH, path_params={"name": node})
        annotations = (document.get("metadata") or {}).get("annotations") or {}
        return dict(annotations)

    def patch_node(self, node: str, patch: Patch) -> None:
        self._patch(NODE_PATH, {"name": node}, patch)

    def patch_pod(self, namespace: str, pod: str, patch: Patch) -> None:
        self._patch(POD_PATH, {"namespace": namespace, "name": pod}, patch)

    def _patch(self, path: str, path_params: Mapping[str, str], patch: Patch) -> None:
        """One strategic-merge PATCH of ``metadata.annotations`` (null deletes a key)."""
        for attempt in range(self._conflict_retries + 1):
            try:
                release(
                    self._connection.request(
                        "PATCH",
                        path,
                        path_params=path_params,
                        body={"metadata": {"annotations": patch}},
                        content_type=STRATEGIC_MERGE_PATCH,
                    )
                )
                return
            except TRANSPORT_ERRORS as error:
                if error_status(error) != 409 or attempt == self._conflict_retries:
                    raise
                log.debug("409 Conflict patching annotations; retry %d", attempt + 1)
                time.sleep(0.05 * (attempt + 1))


class PodApi:
    """One pod read, one PATCH: no retry here; 404 on a read is None (the pod is gone). Other
    failures raise one of ``kube.TRANSPORT_ERRORS`` (a failed precondition: 409 or 422)."""

    def __init__(self, connection: KubeConnection) -> None:
        self._connection = connection

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._connection.get_json(
                POD_PATH, path_params={"namespace": namespace, "name": name}
            )
        except TRANSPORT_ERRORS as error:
            if error_status(error) == 404:
                return None
            raise

    def patch(self, namespace: str, name: str, body: object, content_type: str) -> None:
        release(
            self._connection.request(
                "PATCH",
                POD_PATH,
                path_params={"namespace": namespace, "name": name},
                body=body,
                content_type=content_type,
            )
        )
