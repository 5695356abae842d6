"""Publishes each cycle's profile as node and pod annotations, patching only what changed.

Requests per cycle: none when nothing changed meaningfully; otherwise one strategic-merge PATCH
for the node plus one per pod whose values changed; the first cycle and each heartbeat (default
10 minutes) read the node once first (GET). docs/annotations.md lists the keys.

- ``names``: the annotation names and limits;
- ``values``: the annotations a cycle's result calls for;
- ``changes``: which differences are worth a request (tolerances);
- ``api``: the GET and PATCH calls (409 retried for the usage annotations);
- ``node`` and ``pods``: what each object carries and what was last written to it;
- ``sink``: ``KubernetesSink``, which runs them and backs off when the API fails;
- ``protection``: ``TrainingProtector``, a sink of its own with its own back-off:
  ``karpenter.sh/do-not-disrupt`` on this node's training pods (``--protect-training``), and
  ``release_all`` for ``gpu-profiler unprotect``.
"""

from profiler_app.core.annotations import DEFAULT_DOMAIN, validate_domain
from profiler_app.sinks.kubernetes.api import STRATEGIC_MERGE_PATCH
from profiler_app.sinks.kubernetes.changes import TOLERANCES, Tolerance, diff, significant
from profiler_app.sinks.kubernetes.names import (
    ANNOTATION_BUDGET_BYTES,
    DEFAULT_HEARTBEAT_SECONDS,
    MAX_GPUS,
    PROFILED_AT,
)
from profiler_app.sinks.kubernetes.sink import KubernetesSink
from profiler_app.sinks.kubernetes.values import annotation_bytes, node_annotations, pod_annotations

__all__ = [
    "ANNOTATION_BUDGET_BYTES",
    "DEFAULT_DOMAIN",
    "DEFAULT_HEARTBEAT_SECONDS",
    "MAX_GPUS",
    "PROFILED_AT",
    "STRATEGIC_MERGE_PATCH",
    "TOLERANCES",
    "KubernetesSink",
    "Tolerance",
    "annotation_bytes",
    "diff",
    "node_annotations",
    "pod_annotations",
    "significant",
    "validate_domain",
]
