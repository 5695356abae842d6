"""Volumes a trial could write to that are not its own.

A trial runs the template's containers with the template's volumes. A hostPath, an NFS export,
an inline CSI volume or a PersistentVolumeClaim mounted writable is shared with production:
a trial could overwrite its checkpoints. ``plan`` and ``run`` warn about each; with
``--read-only-volumes`` the trial mounts them read-only (the volume's own ``readOnly`` where it
has one, and every mount of it). The trial's own volumes (emptyDir, ephemeral claims made for
the pod, projected ConfigMaps, Secrets and the downward API) are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Json = dict[str, Any]
TRIAL_ENV = "GPU_PROFILER_TRIAL"
# Volume sources shared with whatever else mounts them, and whether each has ``readOnly``.
SHARED_SOURCES = (
    ("hostPath", False),
    ("nfs", True),
    ("csi", True),
    ("persistentVolumeClaim", True),
)


def _describe(key: str, source: Json) -> str:
    if key == "hostPath":
        return f"hostPath {source.get('path')}"
    if key == "nfs":
        return f"NFS {source.get('server')}:{source.get('path')}"
    if key == "csi":
        return f"CSI volume of driver {source.get('driver')}"
    return f"PersistentVolumeClaim {source.get('claimName')}"


def _mounts(spec: Json) -> Iterator[Json]:
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        yield from container.get("volumeMounts") or ()


def _shared(spec: Json) -> Iterator[tuple[Json, str, Json, str, bool]]:
    """(volume, source key, source, description, has readOnly) of each shared volume."""
    for volume in spec.get("volumes") or ():
        for key, has_read_only in SHARED_SOURCES:
            source = volume.get(key)
            if isinstance(source, dict):
                yield volume, key, source, _describe(key, source), has_read_only


def writable_volumes(spec: Json) -> list[tuple[str, str]]:
    """(volume name, description) of the shared volumes not mounted read-only everywhere."""
    found = []
    for volume, _key, source, description, _has in _shared(spec):
        if source.get("readOnly"):
            continue
        name = volume.get("name")
        mounts = [m for m in _mounts(spec) if m.get("name") == name]
        if not mounts or not all(m.get("readOnly") for m in mounts):
            found.append((str(name), description))
    return found


def volume_warnings(spec: Json) -> list[str]:
    return [
        f"the template mounts {description} writable (volume {name}): trials could overwrite "
        f"what production keeps there (checkpoints); give --read-only-volumes to trial run, "
        f"mount it readOnly, or have the script skip writes when {TRIAL_ENV}=1"
        for name, description in writable_volumes(spec)
    ]


def mount_read_only(spec: Json) -> None:
    """Every shared volume read-only in this pod spec (``--read-only-volumes``)."""
    names = set()
    for volume, _key, source, _description, has_read_only in _shared(spec):
        names.add(volume.get("name"))
        if has_read_only:
            source["readOnly"] = True
    for mount in _mounts(spec):
        if mount.get("name") in names:
            mount["readOnly"] = True
