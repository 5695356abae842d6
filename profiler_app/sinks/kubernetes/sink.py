"""The Kubernetes sink: the node's annotations (node.py), with ``protect_training`` the training
pods' ``karpenter.sh/do-not-disrupt`` (protection.py), then the GPU pods' (pods.py).

Failures: a pod's 404 and a 409 are handled where they happen; 429, 5xx, timeouts and anything
else raise ``KubernetesError``, carrying the server's Retry-After. The sink keeps no back-off of
its own: the daemon waits it out (``profiler_app.backoff``, the one policy) and does not call
``publish`` meanwhile, so a wait is never mistaken for a success.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from profiler_app.annotations import DEFAULT_DOMAIN, validate_domain
from profiler_app.kube import (
    TRANSPORT_ERRORS,
    KubeConnection,
    KubernetesError,
    describe,
    retry_after_seconds,
)
from profiler_app.model import CycleResult
from profiler_app.sinks.kubernetes.api import AnnotationApi
from profiler_app.sinks.kubernetes.names import DEFAULT_HEARTBEAT_SECONDS
from profiler_app.sinks.kubernetes.node import NodeAnnotator
from profiler_app.sinks.kubernetes.pods import PodAnnotator
from profiler_app.sinks.kubernetes.protection import TrainingProtector


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
        protect_training: bool = False,
    ) -> None:
        self.node = node
        self.domain = validate_domain(domain)
        api = AnnotationApi(connection, conflict_retries=conflict_retries)
        self._node = NodeAnnotator(
            api, node, self.domain, heartbeat_seconds=heartbeat_seconds, clock=clock
        )
        self._pods = PodAnnotator(api, self.domain)
        self._protector = TrainingProtector(api, self.domain) if protect_training else None

    def publish(self, result: CycleResult) -> None:
        try:
            self._node.publish(result)
            if self._protector is not None:  # before the usage annotations: it matters more
                self._protector.publish(result)
            self._pods.publish(result.pods)
        except TRANSPORT_ERRORS as error:
            retry_after = retry_after_seconds(error)
            asked = "" if retry_after is None else f", Retry-After {retry_after:g}s"
            raise KubernetesError(
                f"Kubernetes API call failed ({describe(error)}{asked})", retry_after=retry_after
            ) from None

    def close(self) -> None:
        """Nothing to release: the caller owns the connection."""
