"""Block storage: a PersistentVolumeClaim binds and a pod writes to its volume and reads it back.

The pod runs on a node that takes untolerating pods (a CPU node), as Prometheus does with its
volume; the claim is of ``--storage-class`` or the cluster's default class.
"""

from __future__ import annotations

from typing import Any

from tests.smoke.checks.cluster import ApiError, Cluster
from tests.smoke.checks.layout import SMOKE_LABEL
from tests.smoke.checks.pods import pod_manifest

Json = dict[str, Any]
CLAIM = "gpu-smoke-volume"
MOUNT = "/data"
# Run by the pod (python3 -c): write a file on the volume, read it back.
VOLUME_CHECK_SOURCE = (
    "import pathlib\n"
    f"path = pathlib.Path('{MOUNT}/smoke-check')\n"
    "path.write_text('written by the smoke suite')\n"
    "assert path.read_text() == 'written by the smoke suite'\n"
    "print('wrote and read back', path)\n"
)
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def storage_class(cluster: Cluster, wanted: str | None) -> tuple[str | None, str | None]:
    """(the class to use, or None; why none can be used, or None)."""
    classes = cluster.list("/apis/storage.k8s.io/v1/storageclasses")
    names = sorted(c["metadata"]["name"] for c in classes)
    if wanted:
        if wanted in names:
            return wanted, None
        return None, (
            f"StorageClass {wanted} does not exist (the cluster has {', '.join(names) or 'none'})"
        )
    defaults = [
        c["metadata"]["name"]
        for c in classes
        if (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"
    ]
    if len(defaults) == 1:
        return defaults[0], None
    return None, (
        f"no --storage-class given and {len(defaults)} default StorageClasses "
        f"(classes: {', '.join(names) or 'none'})"
    )


def claim_manifest(class_name: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "labels": dict(SMOKE_LABEL)},
        "spec": {
            "storageClassName": class_name,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def writer_manifest(image: str) -> Json:
    manifest = pod_manifest(
        "gpu-smoke-volume-writer",
        image,
        ["python3", "-c", VOLUME_CHECK_SOURCE],
        on_gpu_nodes=False,
    )
    spec = manifest["spec"]
    spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": MOUNT}]
    # The volume's root belongs to root: the pod's group may write there (fsGroup).
    spec["securityContext"] = {"fsGroup": 1000, "runAsUser": 1000, "runAsGroup": 1000}
    return manifest


def claim_problem(cluster: Cluster, namespace: str) -> str | None:
    """Why the claim is not Bound, from its status and events."""
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{CLAIM}"
    try:
        claim = cluster.get(path)
    except ApiError as error:
        return str(error)
    phase = (claim.get("status") or {}).get("phase")
    if phase == "Bound":
        return None
    events = cluster.list(
        f"/api/v1/namespaces/{namespace}/events",
        {"fieldSelector": f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={CLAIM}"},
    )
    said = "; ".join(
        f"{e.get('reason')}: {e.get('message')}" for e in events if e.get("type") == "Warning"
    )
    return f"PersistentVolumeClaim {namespace}/{CLAIM} is {phase}" + (f" ({said})" if said else "")
