"""What counts as a GPU: the one answer to "does this pod use GPUs?".

Protection, pod attribution (``sources.kube_pods``: a pod holding GPUs is reported while it
runs) and the trial runner all ask it here. NVIDIA's device plugin (v0.20.0) offers:

- ``nvidia.com/gpu``: whole GPUs, and MIG devices under ``migStrategy: single``;
- ``nvidia.com/mig-<profile>`` under ``migStrategy: mixed``, one resource per profile
  (``nvidia.com/mig-3g.40gb``; a ``+`` in the profile becomes ``.``: ``internal/rm/rm.go``);
- ``<resource>.shared`` for time-sliced or MPS replicas with ``renameByDefault: true``
  (``api/config/v1/consts.go``, ``DefaultSharedResourceNameSuffix``): ``nvidia.com/gpu.shared``.

A ``rename`` of its own in ``sharing.timeSlicing.resources`` is ignored by v0.20.0
(``DisableResourceNamingInConfig`` in ``api/config/v1/config.go``), but a later or patched
plugin may honour it: ``gpu-profiler run --gpu-resource`` (``GPU_PROFILER_GPU_RESOURCES``) names
such resources, comma-separated, and they count as GPUs beside the ones above.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from profiler_app.core.errors import UserError

WHOLE_GPU = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"
MIG_PREFIX = "nvidia.com/mig-"
GPU_RESOURCES_ENV = "GPU_PROFILER_GPU_RESOURCES"
# An extended resource name: a DNS-subdomain prefix, "/", a name part (at most 63 characters).
_RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _builtin(name: str) -> bool:
    base = name.removesuffix(SHARED_SUFFIX)
    return base == WHOLE_GPU or (base.startswith(MIG_PREFIX) and len(base) > len(MIG_PREFIX))


@dataclass(frozen=True)
class GpuResources:
    """The resource names that are GPUs: the device plugin's own, and ``declared`` renames."""

    declared: frozenset[str] = frozenset()

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (_builtin(name) or name in self.declared)

    def count(self, resources: Mapping[str, Any] | None) -> int:
        """GPU devices in a container's ``requests`` or ``limits`` (every GPU resource added
        up; a quantity that is not a whole number counts as 0)."""
        total = 0
        for name, value in (resources or {}).items():
            if name in self:
                try:
                    total += int(str(value))
                except ValueError:
                    continue
        return total

    def requested(self, resources: Mapping[str, Any] | None) -> list[str]:
        """The GPU resources named in ``resources``, sorted."""
        return sorted(name for name in resources or {} if name in self)


DEFAULT_GPU_RESOURCES = GpuResources()


def parse_gpu_resources(text: str | None, where: str = "--gpu-resource") -> GpuResources:
    """The GPU resources with the renamed ones in ``text`` (comma-separated); UserError naming
    ``where`` for a name that is not an extended resource name."""
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    for name in names:
        if not _RESOURCE_NAME.match(name):
            raise UserError(
                f"{where} {name!r} is not a resource name: use <domain>/<name>, e.g. "
                "nvidia.com/gpu-fast"
            )
    return GpuResources(frozenset(names))
