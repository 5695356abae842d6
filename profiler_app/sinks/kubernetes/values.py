"""The annotations a cycle's result calls for, values rounded so noise does not churn them."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    IO_FIELDS,
    MEM_COPY_UTIL,
    NETWORK_FIELDS,
    CycleResult,
    GpuProfile,
    PodUsage,
)
from profiler_app.sinks import field_stat
from profiler_app.sinks.kubernetes.names import (
    ANNOTATION_BUDGET_BYTES,
    CONFIDENCE,
    ENGINE,
    FB_USED_MAX,
    FRAMEWORK,
    JOB_TYPE,
    MAX_GPUS,
    MEM_COPY_UTIL_MAX,
    MIG_PROFILE,
    NOT_ATTRIBUTABLE,
    PERIOD,
    POD_CPU_UTIL_MAX,
    POD_GPU_MEM_COPY_UTIL_MAX,
    POD_GPU_UTIL_MAX,
    POD_MEM_USED_MAX,
    PROFILED_AT,
    REASONS,
    REASONS_MAX_CHARS,
    UTIL_MAX,
    pod_io_name,
)

log = logging.getLogger(__name__)

_GPU_INDEX = re.compile(r"^[A-Za-z0-9]+$")
_MIG_INSTANCE = re.compile(r"^[0-9]*$")  # '' for a whole GPU


def _prefix(domain: str, profile: GpuProfile) -> str:
    """``<domain>/gpu-<index>-``, or for a MIG instance ``<domain>/gpu-<index>-mig-<id>-``."""
    instance = f"mig-{profile.mig_instance}-" if profile.mig_instance else ""
    return f"{domain}/gpu-{profile.gpu}-{instance}"


Annotations = dict[str, str]


def _whole(value: float | None) -> str | None:
    """Rounded to an integer: a percent or MiB that moves by less does not count as a change."""
    return None if value is None or math.isnan(value) else str(round(value))


def _rfc3339(moment: datetime) -> str:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reasons(reasons: tuple[str, ...]) -> str | None:
    """Reasons joined by "; ", as many whole ones as fit in ``REASONS_MAX_CHARS``."""
    kept: list[str] = []
    for reason in reasons:
        if len("; ".join([*kept, reason])) > REASONS_MAX_CHARS:
            break
        kept.append(reason)
    return "; ".join(kept) or None


def annotation_bytes(annotations: Mapping[str, str | None]) -> int:
    """Size as Kubernetes counts it: keys plus values."""
    return sum(len(key) + len(value or "") for key, value in annotations.items())


def node_annotations(result: CycleResult, domain: str, max_gpus: int = MAX_GPUS) -> Annotations:
    """The node annotations ``result`` calls for."""
    annotations = {f"{domain}/{PROFILED_AT}": _rfc3339(result.at)}
    reasons: Annotations = {}
    profiles = sorted(
        (p for p in result.gpus if _GPU_INDEX.match(p.gpu) and _MIG_INSTANCE.match(p.mig_instance)),
        key=lambda p: (len(p.gpu), p.gpu, len(p.mig_instance), p.mig_instance),
    )
    if len(profiles) > max_gpus:
        log.warning("annotating the first %d of %d GPUs", max_gpus, len(profiles))
    for profile in profiles[:max_gpus]:
        prefix = _prefix(domain, profile)
        values = {
            JOB_TYPE: profile.job_type,
            PERIOD: None
            if profile.period_seconds is None or math.isnan(profile.period_seconds)
            else f"{profile.period_seconds:.1f}",
            UTIL_MAX: _whole(field_stat(profile, GPU_UTIL)),
            MEM_COPY_UTIL_MAX: _whole(field_stat(profile, MEM_COPY_UTIL)),
            FB_USED_MAX: _whole(field_stat(profile, FB_USED)),
            CONFIDENCE: None if profile.confidence is None else f"{profile.confidence:.2f}",
            ENGINE: profile.engine,
            FRAMEWORK: profile.framework,
            MIG_PROFILE: profile.mig_profile or None,
        }
        annotations.update({prefix + name: value for name, value in values.items() if value})
        if text := _reasons(profile.reasons):
            reasons[prefix + REASONS] = text
    if annotation_bytes(annotations) + annotation_bytes(reasons) <= ANNOTATION_BUDGET_BYTES:
        annotations.update(reasons)
    elif reasons:
        log.warning("leaving out the GPUs' reasons: they would exceed the annotation budget")
    return annotations


def pod_annotations(usage: PodUsage, domain: str) -> Annotations:
    """Annotations for a pod that uses GPUs; memory is the peak in MiB (see docs/annotations.md)."""
    memory_mib = None if usage.mem_used_max_bytes is None else usage.mem_used_max_bytes / 2**20
    values = {
        POD_GPU_UTIL_MAX: _whole(usage.gpu_util_max),
        POD_GPU_MEM_COPY_UTIL_MAX: _whole(usage.gpu_mem_copy_util_max),
        POD_CPU_UTIL_MAX: _whole(usage.cpu_util_max),
        POD_MEM_USED_MAX: _whole(memory_mib),
    }
    values.update(_pod_io(usage))
    return {f"{domain}/{name}": value for name, value in values.items() if value is not None}


def _pod_io(usage: PodUsage) -> dict[str, str | None]:
    """Each direction's peak and 95th percentile in MiB/s, 1 decimal; the network's said not
    attributable where the pod's traffic cannot be told from the host's."""
    io = usage.io
    if io is None:
        return {}
    values: dict[str, str | None] = {}
    for direction in IO_FIELDS:
        for statistic in ("max", "p95"):
            name = pod_io_name(direction, statistic)
            if direction in NETWORK_FIELDS and not io.network_attributable:
                values[name] = NOT_ATTRIBUTABLE
                continue
            rate = io.stat(direction, statistic)
            values[name] = None if rate is None or math.isnan(rate) else f"{rate / 2**20:.1f}"
    return values
