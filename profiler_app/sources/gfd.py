"""How this node's GPUs are shared, as GPU feature discovery labels the node
(``nvidia.com/gpu.sharing-strategy``: none, time-slicing or mps; ``nvidia.com/gpu.replicas``).

Read from the node object now and then (the labels change only when the device plugin's
configuration does); a failed read keeps the last answer and is said once: it only adds to the
profiles, so it never fails a cycle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from profiler_app.core.kube import TRANSPORT_ERRORS, KubeConnection
from profiler_app.core.model import MPS, NOT_SHARED, TIME_SLICING

log = logging.getLogger(__name__)

SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
NODE_PATH = "/api/v1/nodes/{name}"
REFRESH_SECONDS = 600.0
_STRATEGIES = {NOT_SHARED, TIME_SLICING, MPS}

Sharing = tuple[str | None, int | None]  # (strategy, replicas); None: not labelled


def gfd_sharing(labels: Mapping[str, str]) -> Sharing:
    """The sharing strategy and replica count GFD's labels give (None where absent or odd)."""
    strategy = labels.get(SHARING_LABEL, "").strip().lower()
    replicas_text = labels.get(REPLICAS_LABEL, "").strip()
    replicas = int(replicas_text) if replicas_text.isdigit() and int(replicas_text) > 0 else None
    return (strategy if strategy in _STRATEGIES else None), replicas


class NodeSharing:
    """``()`` -> this node's GFD sharing labels, re-read every ``refresh_seconds``."""

    def __init__(
        self,
        connection: KubeConnection,
        node: str,
        *,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = connection
        self._node = node
        self._refresh = refresh_seconds
        self._clock = clock
        self._read_at: float | None = None
        self._known: Sharing = (None, None)
        self._failing = False

    def __call__(self) -> Sharing:
        now = self._clock()
        if self._read_at is not None and now - self._read_at < self._refresh:
            return self._known
        self._read_at = now
        try:
            document = self._connection.get_json(NODE_PATH, path_params={"name": self._node})
        except TRANSPORT_ERRORS as error:
            if not self._failing:
                log.warning("cannot read node %s's sharing labels: %s", self._node, error)
            self._failing = True
            return self._known
        self._failing = False
        labels = (document.get("metadata") or {}).get("labels") or {}
        self._known = gfd_sharing({str(key): str(value) for key, value in labels.items()})
        return self._known
