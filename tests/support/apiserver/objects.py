"""The API objects the stand-in API server sends and tests build: ``Status`` objects for
failures (an injected 500 is the real ``InternalError``) and well-formed Pods."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"

Json = dict[str, Any]


def status_object(code: int, reason: str, message: str) -> Json:
    """A ``Status`` object as the API server sends for failures."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def internal_error(cause: str) -> Json:
    """The 500 Status the real server sends for an internal error, as
    kubernetes/apimachinery@v0.35.7:pkg/api/errors/errors.go ``NewInternalError`` builds it
    (reason ``InternalError``, the cause in ``details.causes``). A fail-closed admission webhook
    that cannot be called answers this for every write it covers
    (kubernetes/apiserver@v0.35.7:pkg/admission/plugin/webhook/mutating/dispatcher.go, "failing
    closed"; the cause from pkg/util/webhook/error.go ``ErrCallingWebhook``)."""
    status = status_object(500, "InternalError", f"Internal error occurred: {cause}")
    status["details"] = {"causes": [{"message": cause}]}
    return status


def webhook_down(webhook: str, service: str) -> str:
    """The cause a fail-closed webhook's dead service gives (``ErrCallingWebhook.Error()``)."""
    return (
        f'failed calling webhook "{webhook}": failed to call webhook: Post '
        f'"https://{service}:443/mutate?timeout=10s": dial tcp 10.96.0.42:443: connect: '
        "connection refused"
    )


def pod_manifest(
    namespace: str,
    name: str,
    node: str,
    *,
    gpus: int = 0,
    gpu_resource: str = GPU_RESOURCE,
    phase: str = "Running",
    uid: str | None = None,
    start_time: datetime | None = None,
    annotations: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
) -> Json:
    """A minimal but well-formed Pod, optionally requesting ``gpus`` of ``gpu_resource``
    (``nvidia.com/mig-3g.40gb``, say); ``owner`` is its controller's (kind, name)."""
    resources: Json = {}
    if gpus:
        resources = {"limits": {gpu_resource: str(gpus)}, "requests": {gpu_resource: str(gpus)}}
    started = start_time or datetime(2026, 1, 1, tzinfo=UTC)
    metadata: Json = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuid.uuid4()),
        "annotations": dict(annotations or {}),
    }
    if owner is not None:
        kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1" if kind == "Job" else "kubeflow.org/v1",
                "kind": kind,
                "name": owner_name,
                "uid": str(uuid.uuid4()),
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
        "status": {"phase": phase, "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }
