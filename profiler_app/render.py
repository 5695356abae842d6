"""GPU profiles as JSON records or as a plain aligned table (no wrapping, safe to pipe)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from profiler_app.durations import format_duration
from profiler_app.model import FieldStats, GpuProfile

_FIELD_PREFIXES = ("DCGM_FI_DEV_", "DCGM_FI_PROF_", "DCGM_FI_")


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
        "period_seconds": profile.period_seconds,
        "basis": profile.basis,
        "confidence": profile.confidence,
        "reasons": list(profile.reasons),
        "stats": {field: stats_record(stats) for field, stats in profile.stats.items()},
    }


def render_json(profiles: Sequence[GpuProfile]) -> str:
    return json.dumps([profile_record(p) for p in profiles], indent=2, allow_nan=False)


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
    return "-" if math.isnan(fraction) else f"{fraction * 100:.0f}%"


def render_table(profiles: Sequence[GpuProfile], fields: Sequence[str]) -> str:
    """One row per profile. ``fields[0]`` is the classified field: max, p95, mean and idle share
    are shown for it; the maximum of every other field follows, then the reasons. Columns are
    as wide as their widest cell, numbers right-aligned."""
    primary, *others = fields
    name = short_field_name(primary)
    header = ["NODE", "GPU", "UUID", "POD", "JOB TYPE", "PERIOD", "CONF"]
    header += [f"{name} MAX", "P95", "MEAN", "IDLE"]
    header += [f"{short_field_name(field)} MAX" for field in others]
    header.append("REASONS")
    rows = [header]
    for profile in profiles:
        main = profile.stats.get(primary)
        pod = f"{profile.namespace}/{profile.pod}" if profile.pod else "-"
        period = format_duration(profile.period_seconds) if profile.period_seconds else "-"
        confidence = "-" if profile.confidence is None else f"{profile.confidence:.2f}"
        row = [profile.hostname, profile.gpu, profile.uuid or "-", pod, profile.job_type, period]
        row.append(confidence)
        if main is None:
            row += ["-"] * 4
        else:
            row += [
                _cell(main.max),
                _cell(main.p95),
                _cell(main.mean),
                _percent(main.idle_fraction),
            ]
        row += [_cell(s.max) if (s := profile.stats.get(field)) else "-" for field in others]
        row.append("; ".join(profile.reasons) or "-")
        rows.append(row)
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    numeric = range(5, len(header) - 1)  # PERIOD to the statistics read better right-aligned
    lines = [
        "  ".join(
            cell.rjust(width) if column in numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    return "\n".join(lines)
