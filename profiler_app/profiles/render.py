"""GPU profiles as JSON records or as a plain aligned table (no wrapping, safe to pipe).

``aligned`` is the one table layout of the command line (``analyze`` and ``report``): columns as
wide as their widest cell, never cut, as kubectl prints them. A narrow default shows what most
readers came for; ``wide`` adds the rest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence

from profiler_app.core.durations import format_duration
from profiler_app.core.model import (
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    POWER_USAGE,
    FieldStats,
    GpuProfile,
    stats_of,
)

# ``--output json`` of analyze: its keys and their meaning are a contract (docs/cli.md). Keys may
# be added within a version; removing, renaming or retyping one raises it.
ANALYZE_FORMAT_VERSION = 1
_FIELD_PREFIXES = ("DCGM_FI_DEV_", "DCGM_FI_PROF_", "DCGM_FI_")
# Units of the dcgm-exporter fields the table shows (dcgm-exporter's own, see its counter list).
FIELD_UNITS = {
    GPU_UTIL: "%",
    MEM_COPY_UTIL: "%",
    FB_USED: "MiB",
    FB_FREE: "MiB",
    POWER_USAGE: "W",
    "DCGM_FI_DEV_GPU_TEMP": "C",
    "DCGM_FI_DEV_MEMORY_TEMP": "C",
    "DCGM_FI_DEV_SM_CLOCK": "MHz",
    "DCGM_FI_DEV_MEM_CLOCK": "MHz",
}


def _number(value: float) -> float | None:
    """JSON has no NaN: a statistic with no valid sample is null."""
    return None if math.isnan(value) else value


def stats_record(stats: FieldStats) -> dict[str, float | None]:
    return {
        "max": _number(stats.max),
        "p95": _number(stats.p95),
        "mean": _number(stats.mean),
        "idle_fraction": _number(stats.idle_fraction),
    }


def profile_record(profile: GpuProfile) -> dict[str, object]:
    """One GPU's profile: the labels of its latest series, the pods seen, what runs on it
    (owner, engine, framework), the classification with its basis, confidence and reasons, and
    statistics by field."""
    owner = {"kind": profile.owner_kind, "name": profile.owner_name} if profile.owner_kind else None
    return {
        "labels": dict(profile.labels),
        "hostname": profile.hostname,
        "gpu": profile.gpu,
        "uuid": profile.uuid,
        "mig_instance": profile.mig_instance or None,
        "mig_profile": profile.mig_profile or None,
        "gpu_model": profile.gpu_model or None,
        "namespace": profile.namespace,
        "pod": profile.pod,
        "pods": [
            {"namespace": seen.namespace, "pod": seen.pod, "share": round(seen.share, 4)}
            for seen in profile.pods
        ],
        "owner": owner,
        "engine": profile.engine,
        "framework": profile.framework,
        "job_type": profile.job_type,
        "basis": profile.basis,
        "period_seconds": profile.period_seconds,
        "confidence": profile.confidence,
        "reasons": list(profile.reasons),
        "stats": {field: stats_record(stats) for field, stats in profile.stats.items()},
    }


def render_json(profiles: Sequence[GpuProfile]) -> str:
    document = {
        "kind": "analyze",
        "format_version": ANALYZE_FORMAT_VERSION,
        "gpus": [profile_record(p) for p in profiles],
    }
    return json.dumps(document, indent=2, allow_nan=False)


def short_field_name(field: str) -> str:
    """DCGM_FI_DEV_GPU_UTIL -> GPU_UTIL."""
    for prefix in _FIELD_PREFIXES:
        if field.startswith(prefix):
            return field.removeprefix(prefix)
    return field


def _cell(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value.is_integer():
        return str(int(value))
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{fraction * 100:.0f}"


def _headed(name: str, unit: str | None) -> str:
    return f"{name} {unit}" if unit else name


def render_table(
    profiles: Sequence[GpuProfile], fields: Sequence[str], *, wide: bool = False
) -> str:
    """One row per profile. ``fields[0]`` is the classified field: its maximum and idle share are
    shown (with ``wide``, its p95 and mean, the maximum of every other field, the basis and the
    UUID too), then the reasons. Columns empty for every GPU are left out."""
    primary, *others = fields
    name, unit = short_field_name(primary), FIELD_UNITS.get(primary)
    columns: list[tuple[str, bool]] = [("NODE", False), ("GPU", False)]  # (header, right-aligned)
    columns += [("UUID", False)] if wide else []
    columns += [("POD", False), ("JOB TYPE", False)]
    columns += [("BASIS", False)] if wide else []
    columns += [("PERIOD", True), ("CONF", True), (_headed(f"{name} MAX", unit), True)]
    columns += [(_headed("P95", unit), True), (_headed("MEAN", unit), True)] if wide else []
    columns += [("IDLE %", True)]
    if wide:
        columns += [
            (_headed(f"{short_field_name(field)} MAX", FIELD_UNITS.get(field)), True)
            for field in others
        ]
    columns.append(("REASONS", False))
    rows = []
    for profile in profiles:
        main = stats_of(profile, primary)
        pod = f"{profile.namespace}/{profile.pod}" if profile.pod else "-"
        period = format_duration(profile.period_seconds) if profile.period_seconds else "-"
        confidence = "-" if profile.confidence is None else f"{profile.confidence:.2f}"
        row = [profile.hostname, profile.device] + ([profile.uuid or "-"] if wide else [])
        row += [pod, profile.job_type] + ([profile.basis or "-"] if wide else [])
        row += [period, confidence, "-" if main is None else _cell(main.max)]
        if wide:
            row += ["-", "-"] if main is None else [_cell(main.p95), _cell(main.mean)]
        row.append("-" if main is None else _percent(main.idle_fraction))
        if wide:
            row += [_cell(s.max) if (s := profile.stats.get(field)) else "-" for field in others]
        row.append("; ".join(profile.reasons) or "-")
        rows.append(row)
    keys = {"NODE", "GPU", "JOB TYPE"}
    return aligned(
        [header for header, _ in columns],
        rows,
        right={index for index, (_, right) in enumerate(columns) if right},
        keep={index for index, (header, _) in enumerate(columns) if header in keys},
    )


def aligned(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    keep: Collection[int] = (),
) -> str:
    """Columns as wide as their widest cell, two spaces apart, nothing cut or wrapped. A column
    whose every cell is "-" is left out unless it is in ``keep``; ``right`` columns (numbers) are
    right-aligned."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    return aligned_columns(header, columns, right=right, keep=keep)


def aligned_columns(
    header: Sequence[str],
    columns: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    keep: Collection[int] = (),
) -> str:
    """``aligned`` of the same cells given column by column (the rows of the table transposed)."""
    padded = []  # a comprehension per column, not a generator per line: 8,500 rows, 11 ms not 26
    for index, (name, cells) in enumerate(zip(header, columns, strict=True)):
        if index not in keep and cells and all(cell == "-" for cell in cells):
            continue
        pad = str.rjust if index in right else str.ljust
        width = max(len(name), max(map(len, cells), default=0))
        padded.append([pad(name, width)] + [pad(cell, width) for cell in cells])
    if not padded:
        return "\n" * len(columns[0] if columns else ())
    return "\n".join("  ".join(line).rstrip() for line in zip(*padded, strict=True))
