"""Per-GPU profiles from metric matrices: exactly one per GPU, the primary field classified with
every other signal the GPU has, the other fields summarised.

Series are merged per GPU first (``timelines``): an exporter restart or a pod handover within the
window changes labels, not the GPU. The classifier then gets, per GPU, power judged against the
GPU's own range (``analysis.power``), SM activity where exported, the GPUs of the same job (the
same workload where known, else the same pod; GPUs of no pod on one node when their stalls
coincide) and the prior of its workload: its owner (``workloads``) and the engine it runs
(``engines``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from profiler_app.analysis import (
    Context,
    JobType,
    Prior,
    classify_matrix,
    field_stats,
    power_range,
)
from profiler_app.analysis.io import input_bound_reason
from profiler_app.engines import ENGINE_LABEL, FRAMEWORK_LABEL, Identity, identity_of
from profiler_app.model import (
    ENFORCED_POWER_LIMIT,
    FB_USED,
    GPU_UTIL,
    HELD_MEMORY_MIB,
    MEM_COPY_UTIL,
    POWER_MGMT_LIMIT,
    POWER_USAGE,
    SM_ACTIVE,
    FieldStats,
    FloatMatrix,
    GpuProfile,
    PodIoSeries,
    SeriesMatrix,
)
from profiler_app.timelines import KeyResolver, Pod, Timelines, align, merge
from profiler_app.workloads import Workload, workload_from_labels

# Fields that describe the GPU rather than its work: used to judge power, not summarised.
_LIMIT_FIELDS = (POWER_MGMT_LIMIT, ENFORCED_POWER_LIMIT)
# DCGM's profiling fields are ratios (0-1); classified, they are read in percent.
_RATIO_PREFIX = "DCGM_FI_PROF_"


def _gpu_order(profile: GpuProfile, last: int) -> tuple[str, int, int | str, int, str]:
    """Node, then GPU index; a GPU replaced under the same index sorts by its latest sample,
    so the current one comes last (and wins where only the index keys a value)."""
    numeric = profile.gpu.isdigit()
    return (
        profile.hostname,
        0 if numeric else 1,
        int(profile.gpu) if numeric else profile.gpu,
        last,
        profile.uuid,
    )


def _in_units(stats: FieldStats, scale: float) -> FieldStats:
    if scale == 1.0:
        return stats
    return FieldStats(stats.max / scale, stats.p95 / scale, stats.mean / scale, stats.idle_fraction)


def _memory_held(job_type: str, stats: dict[str, FieldStats]) -> tuple[str, ...]:
    held = stats.get(FB_USED)
    if job_type != "idle" or held is None or not held.max >= HELD_MEMORY_MIB:
        return ()
    return (f"memory held {held.max:.0f} MiB",)


def _input_hint(
    job_type: str,
    util: np.ndarray,
    timestamps: np.ndarray,
    current: Pod | None,
    pod_io: Mapping[Pod, PodIoSeries] | None,
) -> str | None:
    """ "stalls follow disk reads: likely input-bound" for a training GPU whose current pod's
    input bursts line up with its stalls."""
    if job_type != JobType.TRAINING or current is None or not pod_io:
        return None
    series = pod_io.get(current)
    return None if series is None else input_bound_reason(util, timestamps, series)


def _with_input_hint(reasons: tuple[str, ...], hint: str | None) -> tuple[str, ...]:
    """The hint second, after the verdict's first reason: it is news, and the annotation keeps
    only the reasons that fit."""
    return reasons if hint is None else (*reasons[:1], hint, *reasons[1:])


def _power_ranges(
    timelines: Timelines, limits: FloatMatrix | None
) -> tuple[np.ndarray, np.ndarray]:
    """Idle floor and power limit per GPU (NaN where neither an exported limit nor the model
    table knows them)."""
    count = len(timelines.keys)
    floor, limit = np.full(count, np.nan), np.full(count, np.nan)
    exported = np.full(count, np.nan)
    if limits is not None:
        with warnings.catch_warnings():  # rows without a sample are expected: NaN, no warning
            warnings.simplefilter("ignore", RuntimeWarning)
            exported = np.nanmedian(limits, axis=1)
    for row, labels in enumerate(timelines.labels):
        low, high = power_range(labels.get("modelName", ""), float(exported[row]))
        if low is not None and high is not None:
            floor[row], limit[row] = low, high
    return floor, limit


def _dominant_pod(timelines: Timelines, row: int) -> Pod | None:
    shares = timelines.pods[row]
    if shares:
        return shares[0].namespace, shares[0].pod
    return timelines.current[row]


def _workloads(timelines: Timelines, known: Mapping[Pod, Workload] | None) -> list[Workload | None]:
    """Each GPU's workload: the one known for its main pod, else the one its labels name."""
    found: list[Workload | None] = []
    for row, labels in enumerate(timelines.labels):
        pod = _dominant_pod(timelines, row)
        workload = (known or {}).get(pod) if pod is not None else None
        found.append(workload or workload_from_labels(labels))
    return found


def _identities(
    timelines: Timelines, known: Mapping[Pod, Identity] | None
) -> list[Identity | None]:
    """Each GPU's engine and framework: what its processes show (labels of local sampling),
    gaps filled from what its main pod's containers declare."""
    found: list[Identity | None] = []
    for row, labels in enumerate(timelines.labels):
        pod = _dominant_pod(timelines, row)
        declared = (known or {}).get(pod) if pod is not None else None
        seen = identity_of(labels.get(ENGINE_LABEL), labels.get(FRAMEWORK_LABEL))
        found.append(seen.merged(declared) if seen is not None else declared)
    return found


def _prior(
    workload: Workload | None, identity: Identity | None
) -> tuple[Prior | None, tuple[str, ...]]:
    """The prior of a GPU and why: its engine's role wins over its owner's (a Job running vLLM
    serves); both are named."""
    reasons = tuple(
        reason for reason in (identity and identity.reason, workload and workload.reason) if reason
    )
    if identity is not None and identity.role is not None:
        return identity.role, reasons
    return (workload.prior if workload else None), reasons


def _groups(
    timelines: Timelines, workloads: Sequence[Workload | None], node_label: str
) -> np.ndarray:
    """One id per job: GPUs of one workload (where known by name), else of one pod; -1 for a
    GPU with no pod."""
    ids: dict[tuple[str, ...], int] = {}
    groups = np.full(len(timelines.keys), -1, dtype=np.intp)
    for row, labels in enumerate(timelines.labels):
        pod = _dominant_pod(timelines, row)
        if pod is None:
            continue
        node = labels.get(node_label, "")
        workload = workloads[row]
        job = (
            (node, pod[0], workload.kind, workload.name)
            if workload is not None and workload.name
            else (node, *pod)
        )
        groups[row] = ids.setdefault(job, len(ids))
    return groups


def _first_sample(values: np.ndarray, timestamps: np.ndarray) -> float | None:
    sampled = np.flatnonzero(~np.isnan(values))
    return float(timestamps[sampled[0]]) if sampled.size else None


def _nodes(timelines: Timelines, node_label: str) -> np.ndarray:
    """One id per node: GPUs of no known job on one node may be one job (analysis.coupling)."""
    ids: dict[str, int] = {}
    return np.array(
        [ids.setdefault(labels.get(node_label, ""), len(ids)) for labels in timelines.labels],
        dtype=np.intp,
    )


def build_profiles(
    matrices: Sequence[SeriesMatrix],
    primary_field: str = GPU_UTIL,
    node_label: str = "Hostname",
    workloads: Mapping[Pod, Workload] | None = None,
    identities: Mapping[Pod, Identity] | None = None,
    *,
    pod_io: Mapping[Pod, PodIoSeries] | None = None,
) -> list[GpuProfile]:
    """One profile per GPU: ``primary_field`` classified with the GPU's other signals, every
    field summarised. ``workloads`` names the workload of pods by (namespace, pod) (the daemon
    knows them from Kubernetes); without it, well-known labels on the series may.
    ``identities`` names what pods' containers run (``engines``); local sampling puts what
    each GPU's processes run on its series (``engine``/``framework`` labels). ``pod_io`` (the
    pods' disk and network rates) lets a training GPU's reasons say when its stalls follow its
    pod's input (``analysis.io``).

    Raises ``ValueError`` when no matrix holds ``primary_field``.
    """
    primary = next((matrix for matrix in matrices if matrix.field == primary_field), None)
    if primary is None:
        raise ValueError(f"no {primary_field} matrix among {[m.field for m in matrices]}")
    if not primary.labels:
        return []
    resolver = KeyResolver(primary.labels, node_label)
    timelines = merge(primary, resolver)
    fields: dict[str, tuple[FloatMatrix, np.ndarray]] = {}
    for other in matrices:
        if other is not primary and other.field not in fields:
            fields[other.field] = align(other, timelines.keys, resolver, primary.timestamps)
    limits = next((fields[name][0] for name in _LIMIT_FIELDS if name in fields), None)
    floor, limit = _power_ranges(timelines, limits)
    found = _workloads(timelines, workloads)
    running = _identities(timelines, identities)
    priors = [_prior(workload, identity) for workload, identity in zip(found, running, strict=True)]
    context = Context(
        power=fields[POWER_USAGE][0] if POWER_USAGE in fields else None,
        power_floor=floor,
        power_limit=limit,
        sm_active=fields[SM_ACTIVE][0] if SM_ACTIVE in fields else None,
        mem_copy=fields[MEM_COPY_UTIL][0] if MEM_COPY_UTIL in fields else None,
        groups=_groups(timelines, found, node_label),
        nodes=_nodes(timelines, node_label),
        priors=[prior for prior, _ in priors],
        prior_reasons=[reasons for _, reasons in priors],
        names=[f"gpu {labels.get('gpu', '?')}" for labels in timelines.labels],
    )
    scale = 100.0 if primary.field.startswith(_RATIO_PREFIX) else 1.0
    values = timelines.values * scale if scale != 1.0 else timelines.values
    results = classify_matrix(values, primary.step_seconds, context)
    stats: list[dict[str, FieldStats]] = [
        {primary.field: _in_units(result.stats, scale)} for result in results
    ]
    for name, (rows, present) in fields.items():
        if name in _LIMIT_FIELDS or not present.any():
            continue
        rows_present = np.flatnonzero(present).tolist()
        for row, summary in zip(rows_present, field_stats(rows[present]), strict=True):
            stats[row][name] = summary
    profiles: list[tuple[GpuProfile, int]] = []
    for row, (labels, result) in enumerate(zip(timelines.labels, results, strict=True)):
        current = timelines.current[row]
        workload, identity = found[row], running[row]
        profile = GpuProfile(
            gpu=labels.get("gpu", ""),
            uuid=labels.get("UUID", ""),
            hostname=labels.get(node_label, ""),
            job_type=str(result.job_type),
            period_seconds=result.period_seconds,
            stats=stats[row],
            labels=labels,
            namespace=(current[0] or None) if current else None,
            pod=current[1] if current else None,
            confidence=result.confidence,
            reasons=_with_input_hint(
                result.reasons + _memory_held(str(result.job_type), stats[row]),
                _input_hint(str(result.job_type), values[row], primary.timestamps, current, pod_io),
            ),
            basis=result.basis.label,
            pods=timelines.pods[row],
            owner_kind=workload.kind if workload else None,
            owner_name=(workload.name or None) if workload else None,
            first_sample=_first_sample(timelines.values[row], primary.timestamps),
            engine=identity.engine if identity else None,
            framework=identity.framework if identity else None,
        )
        profiles.append((profile, timelines.last[row]))
    return [profile for profile, _ in sorted(profiles, key=lambda item: _gpu_order(*item))]
