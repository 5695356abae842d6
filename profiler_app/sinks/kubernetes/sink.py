"""The Kubernetes sink: the node's annotations (node.py) and the GPU pods' (pods.py). Training
protection (protection.py) is a sink of its own, so that neither waits out the other's back-off.

Failures: a pod's 404 and a 409 are handled where they happen; 429, 5xx, timeouts and anything
else raise ``KubernetesError``, carrying the server's Retry-After, once both parts were tried (a
node PATCH that keeps failing does not stop the pods' annotations). The sink keeps no back-off of
its own: the daemon waits it out (``profiler_app.core.backoff``, the one policy) and does not call
``publish`` meanwhile, so a wait is never mistaken for a success.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from profiler_app.core.annotations import DEFAULT_DOMAIN, validate_domain
from profiler_app.core.kube import (
    TRANSPORT_ERRORS,
    KubeConnection,
    KubernetesError,
    describe,
    retry_after_seconds,
)
from profiler_app.core.model import CycleResult
from profiler_app.sinks.kubernetes.api import AnnotationApi
from profiler_app.sinks.kubernetes.names import DEFAULT_HEARTBEAT_SECONDS
from profiler_app.sinks.kubernetes.node import NodeAnnotator
from profiler_app.sinks.kubernetes.pods import PodAnnotator

T = TypeVar("T")


class KubernetesSink:
    """Node and pod annotations. The connection belongs to the caller, who closes it."""

    name = "kubernetes"

    def __init__(
        self,
        connection: KubeConnection,
        node: str,
        *,
        domain: str = DEFAULT_DOMAIN,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        conflict_retries: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.domain = validate_domain(domain)
        api = AnnotationApi(connection, conflict_retries=conflict_retries)
        self._node = NodeAnnotator(
            api, node, self.domain, heartbeat_seconds=heartbeat_seconds, clock=clock
        )
        self._pods = PodAnnotator(api, self.domain)

    def publish(self, result: CycleResult) -> None:
        # A node PATCH that fails (an RBAC 403, say) does not keep the pods' annotations from
        # being written, nor the other way round; the first failure is raised once both ran.
        node_failure = _attempt(self._node.publish, result)
        pods_failure = _attempt(self._pods.publish, result.pods)
        failure = node_failure or pods_failure
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Nothing to release: the caller owns the connection."""


def _attempt(publish: Callable[[T], None], value: T) -> KubernetesError | None:
    """``publish(value)``; its failure as a KubernetesError (with the server's Retry-After)."""
    try:
        publish(value)
    except KubernetesError as error:
        return error
    except TRANSPORT_ERRORS as error:
        retry_after = retry_after_seconds(error)
        asked = "" if retry_after is None else f", Retry-After {retry_after:g}s"
        return KubernetesError(
            f"Kubernetes API call failed ({describe(error)}{asked})", retry_after=retry_after
        )
    return None
