"""Per-GPU profiles from metric matrices: exactly one per GPU, the primary field classified with
every other signal the GPU has, the other fields summarised.

Series are merged per GPU first (``timelines``): an exporter restart or a pod handover within the
window changes labels, not the GPU. The classifier then gets, per GPU, power judged against the
GPU's own range (``analysis.power``), SM activity where exported, the GPUs of the same job (the
same workload where known, else the same pod; GPUs of no pod on one node when their stalls
coincide) and the prior of its workload: its owner (``workloads``) and the engine it runs
(``engines``).

A MIG instance is a GPU of its own (``timelines``). DCGM_FI_DEV_GPU_UTIL does not exist for
one (dcgm-exporter reads 0 or nothing), so it is classified on DCGM_FI_PROF_GR_ENGINE_ACTIVE in
percent, with DRAM_ACTIVE for memory bandwidth and no power (power is the whole GPU's). Both
fields are relative to the instance (docs/sharing.md), so the classifier's thresholds apply as
they are.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from profiler_app.analysis import (
    Context,
    JobType,
    classify_matrix,
    field_stats,
    power_range,
)
from profiler_app.analysis.io import input_bound_reason
from profiler_app.core.model import (
    DRAM_ACTIVE,
    ENFORCED_POWER_LIMIT,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    HELD_MEMORY_MIB,
    MEM_COPY_UTIL,
    MIG_PROFILE_LABEL,
    MPS,
    NOT_SHARED,
    POWER_MGMT_LIMIT,
    POWER_USAGE,
    SM_ACTIVE,
    TIME_SLICING,
    FieldStats,
    FloatMatrix,
    GpuProfile,
    Identity,
    PodGpuPeak,
    PodIoSeries,
    Prior,
    SeriesMatrix,
    mig_instance,
)
from profiler_app.profiles.engines import ENGINE_LABEL, FRAMEWORK_LABEL, identity_of
from profiler_app.profiles.exporter_series import split_field, with_node_label
from profiler_app.profiles.timelines import (
    GpuKey,
    KeyResolver,
    Pod,
    Timelines,
    align,
    merge,
    on_grid,
)
from profiler_app.profiles.workloads import Workload, workload_from_labels

# Fields that describe the GPU rather than its work: used to judge power, not summarised.
_LIMIT_FIELDS = (POWER_MGMT_LIMIT, ENFORCED_POWER_LIMIT)
# DCGM's profiling fields are ratios (0-1); classified, they are read in percent.
_RATIO_PREFIX = "DCGM_FI_PROF_"


def _gpu_order(profile: GpuProfile, last: int) -> tuple[str, int, int | str, int, str, int, str]:
    """Node, GPU index, then MIG instance; a GPU replaced under the same index sorts by its
    latest sample, so the current one comes last (and wins where only the index keys a value)."""
    numeric = profile.gpu.isdigit()
    instance = profile.mig_instance
    return (
        profile.hostname,
        0 if numeric else 1,
        int(profile.gpu) if numeric else profile.gpu,
        int(instance) if instance.isdigit() else -1,
        instance,
        last,
        profile.uuid,
    )


def _split(
    matrices: Sequence[SeriesMatrix], primary_field: str, node_label: str
) -> tuple[list[SeriesMatrix], SeriesMatrix | None, list[SeriesMatrix]]:
    """The device-level series of every field, the primary field's presence-only series and the
    pods' own series (``exporter_series``)."""
    primary = next(matrix for matrix in matrices if matrix.field == primary_field)
    resolver = KeyResolver(primary.labels, node_label)
    devices, own = [], []
    presence = None
    for matrix in matrices:
        split = split_field(matrix, resolver)
        devices.append(split.device)
        if split.own is not None:
            own.append(split.own)
        if matrix.field == primary_field:
            presence = split.presence
    return devices, presence, own


def _pod_peaks(
    per_pod: Sequence[SeriesMatrix], resolver: KeyResolver
) -> dict[GpuKey, tuple[PodGpuPeak, ...]]:
    """Each GPU's pods with their own peaks of GPU utilisation and framebuffer."""
    found: dict[GpuKey, dict[Pod, dict[str, float]]] = {}
    for matrix in per_pod:
        if matrix.field not in (GPU_UTIL, FB_USED):
            continue
        for labels, values in zip(matrix.labels, matrix.values, strict=True):
            pod = labels.get("pod")
            sampled = values[np.isfinite(values)]
            if not pod or not sampled.size:
                continue
            peaks = found.setdefault(resolver.key(labels), {}).setdefault(
                (labels.get("namespace", ""), pod), {}
            )
            peaks[matrix.field] = max(peaks.get(matrix.field, -np.inf), float(sampled.max()))
    return {
        key: tuple(
            PodGpuPeak(namespace, pod, fields.get(GPU_UTIL), fields.get(FB_USED))
            for (namespace, pod), fields in sorted(pods.items())
        )
        for key, pods in found.items()
    }


def _with_mig_instances(
    primary: SeriesMatrix, matrices: Sequence[SeriesMatrix], node_label: str
) -> SeriesMatrix:
    """GPU utilisation of whole GPUs, and of each MIG instance its GR_ENGINE_ACTIVE in percent
    in place of GPU_UTIL, which is no measurement there (dcgm-exporter reads 0 or nothing, NVML
    nothing). An instance without GR_ENGINE_ACTIVE keeps a row without samples: it is listed,
    and its verdict says it had none."""
    engine = next((matrix for matrix in matrices if matrix.field == GR_ENGINE_ACTIVE), None)
    measured = (
        [row for row, labels in enumerate(engine.labels) if mig_instance(labels)] if engine else []
    )
    unmeasured = [row for row, labels in enumerate(primary.labels) if mig_instance(labels)]
    if not measured and not unmeasured:
        return primary

    def instance(labels: dict[str, str]) -> tuple[str, ...]:
        return tuple(labels.get(name, "") for name in (node_label, "UUID", "gpu", "GPU_I_ID"))

    known = {instance(engine.labels[row]) for row in measured} if engine else set()
    unmeasured = [row for row in unmeasured if instance(primary.labels[row]) not in known]
    whole = [row for row, labels in enumerate(primary.labels) if not mig_instance(labels)]
    labels = [primary.labels[row] for row in whole + unmeasured]
    parts = [primary.values[whole], np.full((len(unmeasured), primary.timestamps.size), np.nan)]
    if engine is not None and measured:
        labels += [engine.labels[row] for row in measured]
        moved = on_grid(engine.values[measured], engine.timestamps, primary.timestamps)
        parts.append(moved * 100.0)
    values = np.vstack(parts) if labels else np.empty((0, primary.timestamps.size))
    return SeriesMatrix(primary.field, labels, primary.timestamps, values, primary.step_seconds)


def _sharing(seen: bool, node: tuple[str | None, int | None] | None) -> tuple[str, int | None]:
    """A whole GPU's ``sharing`` and ``replicas``: GPU feature discovery's labels where the
    node has them (which kind, how many), else what the series show (several pods at once:
    time-slicing, which MPS also looks like)."""
    strategy, replicas = node or (None, None)
    if strategy in (TIME_SLICING, MPS):
        return strategy, replicas
    return (TIME_SLICING if seen else NOT_SHARED), None


def _no_samples(values: np.ndarray) -> bool:
    return not bool(np.isfinite(values).any())


def _unsampled(values: np.ndarray, mig: bool) -> tuple[str, ...]:
    """The reason of a verdict without a single utilisation sample (confidence 0)."""
    if not _no_samples(values):
        return ()
    if mig:
        return ("no utilisation samples: read DCGM_FI_PROF_GR_ENGINE_ACTIVE for MIG instances",)
    return ("no utilisation samples",)


def _mig_rows(timelines: Timelines) -> np.ndarray:
    return np.array([bool(mig_instance(labels)) for labels in timelines.labels], dtype=bool)


def _instance_fields(
    fields: dict[str, tuple[FloatMatrix, np.ndarray]], mig: np.ndarray
) -> tuple[FloatMatrix | None, FloatMatrix | None, FloatMatrix | None]:
    """Power, SM activity and memory bandwidth as the classifier reads them: on MIG instances
    no power (the whole GPU's) and DRAM_ACTIVE in percent for memory bandwidth; SM activity
    capped at 1 (DCGM reads above 1 on MIG instances)."""
    power = fields[POWER_USAGE][0] if POWER_USAGE in fields else None
    if power is not None and mig.any():
        power = power.copy()
        power[mig] = np.nan
    sm_active = fields[SM_ACTIVE][0] if SM_ACTIVE in fields else None
    if sm_active is not None:
        sm_active = np.minimum(sm_active, 1.0)
    mem_copy = fields[MEM_COPY_UTIL][0] if MEM_COPY_UTIL in fields else None
    if mig.any() and DRAM_ACTIVE in fields:
        dram = fields[DRAM_ACTIVE][0] * 100.0
        mem_copy = np.where(mig[:, None], dram, np.nan if mem_copy is None else mem_copy)
    elif mem_copy is not None and mig.any():
        mem_copy = np.where(mig[:, None], np.nan, mem_copy)
    return power, sm_active, mem_copy


def _scale(field: str) -> float:
    return 100.0 if field.startswith(_RATIO_PREFIX) else 1.0


def _summaries(
    fields: Mapping[str, tuple[FloatMatrix, np.ndarray]],
    mig: np.ndarray,
    classified: Sequence[FieldStats],
    primary_field: str,
) -> list[dict[str, FieldStats]]:
    """Each GPU's statistics by field, in the field's own units: the classified field's from
    the classifier (on a MIG instance GR_ENGINE_ACTIVE's), the others summarised; no power on
    MIG instances."""
    stats: list[dict[str, FieldStats]] = [
        {GR_ENGINE_ACTIVE: _in_units(summary, 100.0)}  # classified in percent
        if mig[row] and primary_field == GPU_UTIL
        else {primary_field: _in_units(summary, _scale(primary_field))}
        for row, summary in enumerate(classified)
    ]
    for name, (rows, present) in fields.items():
        if name in _LIMIT_FIELDS or not present.any():
            continue
        summarised = present & ~mig if name == POWER_USAGE else present
        rows_present = np.flatnonzero(summarised).tolist()
        for row, summary in zip(rows_present, field_stats(rows[summarised]), strict=True):
            stats[row].setdefault(name, summary)
    return stats


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
    node_sharing: tuple[str | None, int | None] | None = None,
    pod_io: Mapping[Pod, PodIoSeries] | None = None,
) -> list[GpuProfile]:
    """One profile per GPU: ``primary_field`` classified with the GPU's other signals, every
    field summarised. ``workloads`` names the workload of pods by (namespace, pod) (the daemon
    knows them from Kubernetes); without it, well-known labels on the series may.
    ``identities`` names what pods' containers run (``engines``); local sampling puts what
    each GPU's processes run on its series (``engine``/``framework`` labels).
    ``node_sharing``: the node's sharing strategy and replicas as GPU feature discovery labels
    them (``sources.gfd``), which say which kind of sharing the series show and how many.
    ``pod_io`` (the pods' disk and network rates) lets a training GPU's reasons say when its
    stalls follow its pod's input (``analysis.io``).

    Raises ``ValueError`` when no matrix holds ``primary_field``.
    """
    primary = next((matrix for matrix in matrices if matrix.field == primary_field), None)
    if primary is None:
        raise ValueError(f"no {primary_field} matrix among {[m.field for m in matrices]}")
    matrices = with_node_label(matrices, node_label)
    matrices, presence, per_pod = _split(matrices, primary_field, node_label)
    primary = next(matrix for matrix in matrices if matrix.field == primary_field)
    if primary.field == GPU_UTIL:
        primary = _with_mig_instances(primary, matrices, node_label)
    if not primary.labels:
        return []
    resolver = KeyResolver(primary.labels, node_label)
    timelines = merge(primary, resolver, presence)
    fields: dict[str, tuple[FloatMatrix, np.ndarray]] = {}
    for other in matrices:
        if other is not primary and other.field not in fields:
            fields[other.field] = align(other, timelines.keys, resolver, primary.timestamps)
    limits = next((fields[name][0] for name in _LIMIT_FIELDS if name in fields), None)
    mig = _mig_rows(timelines)
    floor, limit = _power_ranges(timelines, limits)
    floor[mig], limit[mig] = np.nan, np.nan
    power, sm_active, mem_copy = _instance_fields(fields, mig)
    peaks = _pod_peaks(per_pod, resolver)
    found = _workloads(timelines, workloads)
    running = _identities(timelines, identities)
    priors = [_prior(workload, identity) for workload, identity in zip(found, running, strict=True)]
    context = Context(
        power=power,
        power_floor=floor,
        power_limit=limit,
        sm_active=sm_active,
        mem_copy=mem_copy,
        groups=_groups(timelines, found, node_label),
        nodes=_nodes(timelines, node_label),
        priors=[prior for prior, _ in priors],
        prior_reasons=[reasons for _, reasons in priors],
        names=[f"gpu {labels.get('gpu', '?')}" for labels in timelines.labels],
    )
    scale = _scale(primary.field)
    values = timelines.values * scale if scale != 1.0 else timelines.values
    results = classify_matrix(values, primary.step_seconds, context)
    stats = _summaries(fields, mig, [result.stats for result in results], primary.field)
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
            confidence=0.0 if _no_samples(timelines.values[row]) else result.confidence,
            reasons=_unsampled(timelines.values[row], mig[row])
            or _with_input_hint(
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
            mig_instance=mig_instance(labels),
            mig_profile=labels.get(MIG_PROFILE_LABEL, ""),
            gpu_model=labels.get("modelName", ""),
        )
        if mig[row] and primary.field == GPU_UTIL:
            profile = replace(profile, util_field=GR_ENGINE_ACTIVE, mem_field=DRAM_ACTIVE)
        if not mig[row]:
            # Several pods at once, in their own series too (local sampling has no other sign).
            seen = timelines.shared[row] or len(peaks.get(timelines.keys[row], ())) > 1
            sharing, replicas = _sharing(seen, node_sharing)
            profile = replace(
                profile,
                sharing=sharing,
                replicas=replicas,
                pod_peaks=peaks.get(timelines.keys[row], ()),
            )
        profiles.append((profile, timelines.last[row]))
    return [profile for profile, _ in sorted(profiles, key=lambda item: _gpu_order(*item))]
