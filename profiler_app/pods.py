"""Which pod each GPU served, and each GPU-using pod's peaks (GPU from the profiles, CPU and
memory from the pod's cgroup or, where that is not visible, from Prometheus' cAdvisor series).

Pure functions: the daemon passes the profiles, the pods the Kubernetes watcher knows on this
node, the cgroup peaks by pod UID and the cAdvisor peaks by (namespace, pod).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from profiler_app.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, GpuProfile, PodPeak, PodUsage

if TYPE_CHECKING:  # the Kubernetes client is imported only when Kubernetes is used
    from profiler_app.sources.kube_pods import PodInfo

# Label the NVML source puts on a GPU's series: the pod whose processes use it (by cgroup).
POD_UID_LABEL = "pod_uid"


def attribute_profiles(profiles: Sequence[GpuProfile], pods: Sequence[PodInfo]) -> list[GpuProfile]:
    """Names the pod of profiles that carry only a pod UID (local NVML sampling)."""
    by_uid = {pod.uid: pod for pod in pods}
    attributed = []
    for profile in profiles:
        pod = by_uid.get(profile.labels.get(POD_UID_LABEL, ""))
        if profile.pod is None and pod is not None:
            attributed.append(replace(profile, namespace=pod.namespace, pod=pod.name))
        else:
            attributed.append(profile)
    return attributed


@dataclass
class _Peaks:
    gpus: list[str] = field(default_factory=list)
    gpu_util: list[float] = field(default_factory=list)
    gpu_mem_util: list[float] = field(default_factory=list)
    fb_used: list[float] = field(default_factory=list)


def _max(values: list[float]) -> float | None:
    finite = [value for value in values if math.isfinite(value)]
    return max(finite) if finite else None


def pod_usage(
    profiles: Sequence[GpuProfile],
    pods: Sequence[PodInfo],
    cgroup_peaks: Mapping[str, PodPeak],
    node: str,
    metric_peaks: Mapping[tuple[str, str], PodPeak] | None = None,
) -> list[PodUsage]:
    """One ``PodUsage`` per pod that used a GPU in the window or requests GPUs.

    CPU and memory come from ``cgroup_peaks`` (by pod UID) where it has them; ``metric_peaks``
    (by namespace and pod, from Prometheus) fills what the cgroups leave as None.
    """
    known = {(pod.namespace, pod.name): pod for pod in pods}
    usage: dict[tuple[str, str], _Peaks] = {}
    for pod in pods:
        if pod.uses_gpus:
            usage[pod.namespace, pod.name] = _Peaks()
    for profile in profiles:
        if not profile.pod:
            continue
        peaks = usage.setdefault((profile.namespace or "", profile.pod), _Peaks())
        if profile.gpu not in peaks.gpus:
            peaks.gpus.append(profile.gpu)
        for name, values in (
            (GPU_UTIL, peaks.gpu_util),
            (MEM_COPY_UTIL, peaks.gpu_mem_util),
            (FB_USED, peaks.fb_used),
        ):
            stats = profile.stats.get(name)
            if stats is not None:
                values.append(stats.max)
    result = []
    for (namespace, name), peaks in sorted(usage.items()):
        info = known.get((namespace, name))
        cgroup = cgroup_peaks.get(info.uid) if info is not None else None
        peak = _merged(cgroup, (metric_peaks or {}).get((namespace, name)))
        result.append(
            PodUsage(
                namespace=namespace,
                pod=name,
                node=node,
                start_time=info.start_time if info is not None else None,
                gpus=tuple(peaks.gpus),
                gpu_util_max=_max(peaks.gpu_util),
                gpu_mem_util_max=_max(peaks.gpu_mem_util),
                fb_used_max_mib=_max(peaks.fb_used),
                cpu_util_max=peak.cpu_util_max,
                mem_used_max_bytes=peak.mem_used_max_bytes,
            )
        )
    return result


def _merged(first: PodPeak | None, second: PodPeak | None) -> PodPeak:
    """Each resource from ``first`` where known, else from ``second``."""
    first = first or PodPeak(None, None)
    second = second or PodPeak(None, None)
    return PodPeak(
        cpu_util_max=first.cpu_util_max if first.cpu_util_max is not None else second.cpu_util_max,
        mem_used_max_bytes=first.mem_used_max_bytes
        if first.mem_used_max_bytes is not None
        else second.mem_used_max_bytes,
    )
