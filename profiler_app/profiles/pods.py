"""Which pod each GPU served, each pod's workload, and each GPU-using pod's peaks (GPU from the
profiles, CPU and memory from the pod's cgroup or, where that is not visible, from Prometheus'
cAdvisor series) and disk and network rates (the same two ways).

Pure functions: the daemon passes the matrices or profiles, the pods the Kubernetes watcher knows
on this node, the cgroup peaks by pod UID, the cAdvisor peaks by (namespace, pod) and the pods'
disk and network series by (namespace, pod).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from profiler_app.analysis.io import io_rates
from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    MPS,
    NETWORK_FIELDS,
    SHARED_NOT_ATTRIBUTABLE,
    SHARED_PER_POD,
    TIME_SLICING,
    GpuProfile,
    Identity,
    PodInfo,
    PodIoSeries,
    PodPeak,
    PodShare,
    PodUsage,
    SeriesMatrix,
    stats_of,
)

# dcgm-exporter's pod UID label, which the NVML source also puts on a GPU's series (the pod
# whose processes use it, by cgroup).
from profiler_app.profiles.exporter_series import POD_UID_LABEL
from profiler_app.profiles.workloads import Workload, workload_from_owner


def attribute_series(
    matrices: Sequence[SeriesMatrix], pods: Sequence[PodInfo]
) -> list[SeriesMatrix]:
    """Series that carry only a pod UID (local NVML sampling) get the pod's ``namespace`` and
    ``pod`` labels, so they are grouped and reported like dcgm-exporter's."""
    by_uid = {pod.uid: pod for pod in pods}
    attributed = []
    for matrix in matrices:
        labels = []
        for series in matrix.labels:
            pod = by_uid.get(series.get(POD_UID_LABEL, ""))
            named = pod is not None and not series.get("pod")
            labels.append(
                {**series, "namespace": pod.namespace, "pod": pod.name}
                if named and pod is not None
                else series
            )
        attributed.append(replace(matrix, labels=labels))
    return attributed


def identities_of(pods: Sequence[PodInfo]) -> dict[tuple[str, str], Identity]:
    """What the containers of every pod that declares it run, by (namespace, pod)."""
    return {(pod.namespace, pod.name): pod.identity for pod in pods if pod.identity is not None}


def io_by_pod(
    pods: Sequence[PodInfo],
    by_uid: Mapping[str, PodIoSeries],
    by_name: Mapping[tuple[str, str], PodIoSeries] | None = None,
) -> dict[tuple[str, str], PodIoSeries]:
    """Each pod's disk and network series by (namespace, pod): the pod's cgroup and namespace
    (``by_uid``, local mode) where read, else Prometheus' (``by_name``). A pod on the host's
    network has its network left out and said not attributable, whichever source counted it:
    those counters are the node's."""
    found = dict(by_name or {})
    for pod in pods:
        local = by_uid.get(pod.uid)
        if local is not None:
            found[pod.namespace, pod.name] = local
    for pod in pods:
        key = (pod.namespace, pod.name)
        if pod.host_network and key in found:
            series = found[key]
            found[key] = replace(
                series,
                rates={d: r for d, r in series.rates.items() if d not in NETWORK_FIELDS},
                network_attributable=False,
            )
    return found


def workloads_of(pods: Sequence[PodInfo]) -> dict[tuple[str, str], Workload]:
    """The workload of every pod whose owner chain or labels name one, by (namespace, pod)."""
    found = {}
    for pod in pods:
        workload = workload_from_owner(pod.owner_kind, pod.owner_name, pod.labels)
        if workload is not None:
            found[pod.namespace, pod.name] = workload
    return found


@dataclass
class _Peaks:
    gpus: list[str] = field(default_factory=list)
    gpu_util: list[float] = field(default_factory=list)
    gpu_mem_copy_util: list[float] = field(default_factory=list)
    fb_used: list[float] = field(default_factory=list)
    first_seen: float | None = None
    last_seen: float | None = None
    owner: Workload | None = None
    attribution: str | None = None  # on a shared GPU (PodUsage.gpu_attribution)

    def seen(self, first: float | None, last: float | None) -> None:
        if first is not None:
            self.first_seen = first if self.first_seen is None else min(self.first_seen, first)
        if last is not None:
            self.last_seen = last if self.last_seen is None else max(self.last_seen, last)


def _max(values: list[float]) -> float | None:
    finite = [value for value in values if math.isfinite(value)]
    return max(finite) if finite else None


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _add_profile(
    usage: dict[tuple[str, str], _Peaks],
    profile: GpuProfile,
    known: Mapping[tuple[str, str], object],
    listed_only: bool,
) -> None:
    """The GPU counts for every pod seen on it in the window; its peaks only for the current
    pod (the others' were recorded while they were current). A former pod Kubernetes no longer
    lists is left alone: its start time, part of its key in the store, is not known any more;
    with ``listed_only``, so is a current one."""
    current = (profile.namespace or "", profile.pod or "")
    shares = profile.pods
    if not shares and profile.pod:  # a source that says no more than the current pod
        shares = (PodShare(*current, 1.0),)
    # On a shared GPU every pod there at its latest sample is current, and so is every pod
    # with series of its own (local NVML sampling labels the device with one pod only).
    latest = max((share.last_seen or 0.0 for share in shares), default=0.0)
    # Several pods on it (or its pods' own series): a GPU configured for sharing that one pod
    # holds is that pod's.
    shared = profile.sharing in (TIME_SLICING, MPS) and (len(shares) > 1 or bool(profile.pod_peaks))
    if shared:
        named = {(share.namespace, share.pod) for share in shares}
        shares = (
            *shares,
            *(
                PodShare(own.namespace, own.pod, 0.0, None, latest or None)
                for own in profile.pod_peaks
                if (own.namespace, own.pod) not in named
            ),
        )
    for share in shares:
        key = (share.namespace, share.pod)
        now = key == current or (shared and (share.last_seen or 0.0) >= latest)
        if key not in known and (listed_only or not now):
            continue
        peaks = usage.setdefault(key, _Peaks())
        if profile.device not in peaks.gpus:
            peaks.gpus.append(profile.device)
        peaks.seen(share.first_seen, share.last_seen)
        if shared:
            _add_shared(peaks, profile, key)
            continue
        if key != current:
            continue
        for field_name, values in (
            (GPU_UTIL, peaks.gpu_util),
            (MEM_COPY_UTIL, peaks.gpu_mem_copy_util),
            (FB_USED, peaks.fb_used),
        ):
            stats = stats_of(profile, field_name)
            if stats is not None:
                values.append(stats.max)


def _add_shared(peaks: _Peaks, profile: GpuProfile, pod: tuple[str, str]) -> None:
    """A pod's peaks on a shared GPU: its own series' where they exist, else none (never the
    whole GPU's figures)."""
    own = next((p for p in profile.pod_peaks if (p.namespace, p.pod) == pod), None)
    if own is None:
        peaks.attribution = SHARED_NOT_ATTRIBUTABLE
        return
    if peaks.attribution is None:
        peaks.attribution = SHARED_PER_POD
    if own.util_max is not None:
        peaks.gpu_util.append(own.util_max)
    if own.fb_used_max_mib is not None:
        peaks.fb_used.append(own.fb_used_max_mib)


def pod_usage(
    profiles: Sequence[GpuProfile],
    pods: Sequence[PodInfo],
    cgroup_peaks: Mapping[str, PodPeak],
    node: str,
    metric_peaks: Mapping[tuple[str, str], PodPeak] | None = None,
    *,
    listed_only: bool = False,
    io: Mapping[tuple[str, str], PodIoSeries] | None = None,
) -> list[PodUsage]:
    """One ``PodUsage`` per pod that used a GPU in the window or holds GPUs now.

    A pod seen on a GPU anywhere in the window counts, also one that has finished since; a pod
    that requests GPUs counts while it runs (it holds them even with nothing on them). CPU and
    memory come from ``cgroup_peaks`` (by pod UID) where it has them; ``metric_peaks`` (by
    namespace and pod, from Prometheus) fills what the cgroups leave as None. ``io`` (by
    namespace and pod, ``io_by_pod``) gives the disk and network rates.

    ``listed_only`` (Kubernetes is on): only pods in ``pods`` that have started count. A pod
    the series name but Kubernetes does not list on this node (not listed yet, moved to
    another node, deleted) or lists without a start time (not started) is not this node's to
    report: its start time, part of its key in the store, is unknown.
    """
    known = {
        (pod.namespace, pod.name): pod
        for pod in pods
        if not listed_only or pod.start_time is not None
    }
    workloads = workloads_of(pods)
    usage: dict[tuple[str, str], _Peaks] = {}
    for key, pod in known.items():
        if pod.uses_gpus and not pod.finished:
            usage[key] = _Peaks()
    for profile in profiles:
        _add_profile(usage, profile, known, listed_only)
        named = usage.get((profile.namespace or "", profile.pod or ""))
        if profile.owner_kind and profile.pod and named is not None:  # labels on the series
            named.owner = Workload(profile.owner_kind, profile.owner_name or "", None)
    result = []
    for (namespace, name), peaks in sorted(usage.items()):
        info = known.get((namespace, name))
        cgroup = cgroup_peaks.get(info.uid) if info is not None else None
        peak = _merged(cgroup, (metric_peaks or {}).get((namespace, name)))
        owner = workloads.get((namespace, name)) or peaks.owner
        result.append(
            PodUsage(
                namespace=namespace,
                pod=name,
                node=node,
                start_time=info.start_time if info is not None else None,
                gpus=tuple(peaks.gpus),
                gpu_util_max=_max(peaks.gpu_util),
                gpu_mem_copy_util_max=_max(peaks.gpu_mem_copy_util),
                fb_used_max_mib=_max(peaks.fb_used),
                cpu_util_max=peak.cpu_util_max,
                mem_used_max_bytes=peak.mem_used_max_bytes,
                first_seen=_time(peaks.first_seen),
                last_seen=_time(peaks.last_seen),
                owner_kind=owner.kind if owner else None,
                owner_name=(owner.name or None) if owner else None,
                gpu_attribution=peaks.attribution,
                io=io_rates(series) if (series := (io or {}).get((namespace, name))) else None,
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
