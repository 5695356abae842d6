"""Right-sizing's rollups: per workload and hour (and day), what ``report --by rightsize``
needs, written in the cycle's transaction as the other rollups are.

Two tables per bucket length:

- ``rightsize_hour`` / ``rightsize_day``: per workload, GPU model and MIG profile (the view
  advises per workload and reads the model and profile it ran as; '' when not known): covered
  and idle seconds, the framebuffer and utilisation peaks, the first and last moment covered,
  the covered time of training rows whose period was found;
- ``activity_hour`` / ``activity_day``: per workload, histograms of the windows' SM activity
  p95 (``sm``), SM activity mean (``sm_mean``) and DRAM activity p95 (``dram``), one row per
  1 %-wide bucket holding the covered seconds of the windows whose value falls in it.

Why per workload, not per GPU (revision 0011): the view's output is one advice per workload,
and every figure it reads merges over the workload's GPUs (sums, peaks, histograms), so the GPU
in the key only multiplied the rows a report reads: by the GPUs a workload runs on, and by the
GPUs' churn. The rows of a range now grow with the workloads, not with GPUs x workloads.
Several nodes' daemons upsert the same rows; each cycle writes its upserts in key order, so two
writers take the rows' locks in the same order and cannot deadlock on them.

Why fixed buckets, not a quantile sketch such as DDSketch: the values are DCGM ratios bounded to
[0, 1] (right-sizing clamps MIG's readings above 1), so 101 buckets of one percentage point give
every quantile to within one point with no relative-error parameter to choose; the merge is a
sum per bucket (no sketch library in the report or the writer), and the buckets a GPU-hour uses
are few (a window's p95 moves little within an hour). DDSketch's edge, bounded relative error
over an unbounded range, buys nothing on a bounded one. Once an hour or day is complete, the
writer packs its histogram rows into one row per workload (``packing.py``, revision 0012).

A quantile read from the histogram is the lower edge of the bucket where the covered time
reaches it: exact when the raw value is a whole percent, at most one point under otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.rollups import (
    DAY_SECONDS,
    HOUR_SECONDS,
    MICROSECONDS,
    Tier,
    covers_microseconds,
    microseconds,
    pieces,
    tier_upsert,
)
from profiler_app.sinks.store.statements import Merge

BUCKETS = 101  # 0 %, 1 %, ... 100 % (and above: MIG can read over 1)
# The histograms' metrics and the raw column each bins.
METRICS = {"sm": "sm_active_p95", "sm_mean": "sm_active_mean", "dram": "dram_active_p95"}
WORKLOAD_KEY = ("namespace", "workload")
SUMMARY_KEY = (*WORKLOAD_KEY, "gpu_model", "mig_profile")
HISTOGRAM_KEY = (*WORKLOAD_KEY, "metric", "percent")
RIGHTSIZE_HOUR = Tier("rightsize_hour", "hour", HOUR_SECONDS, SUMMARY_KEY)
RIGHTSIZE_DAY = Tier("rightsize_day", "day", DAY_SECONDS, SUMMARY_KEY)
ACTIVITY_HOUR = Tier("activity_hour", "hour", HOUR_SECONDS, HISTOGRAM_KEY)
ACTIVITY_DAY = Tier("activity_day", "day", DAY_SECONDS, HISTOGRAM_KEY)
SUMMARY_TIERS = (RIGHTSIZE_HOUR, RIGHTSIZE_DAY)
HISTOGRAM_TIERS = (ACTIVITY_HOUR, ACTIVITY_DAY)
ACTIVITY_TIERS = (*SUMMARY_TIERS, *HISTOGRAM_TIERS)

SUMMARY_VALUES = {
    "covered_seconds": Merge.ADD,
    "idle_gpu_seconds": Merge.ADD,
    "util_max": Merge.LARGER,
    "fb_used_max_mib": Merge.LARGER,
    "first_start": Merge.SMALLER,
    "last_end": Merge.LARGER,
    "period_covered_seconds": Merge.ADD,
}
HISTOGRAM_VALUES = {"seconds": Merge.ADD}
_TRAINING = "training"


def percent_bucket(ratio: float) -> int:
    """The 1 %-wide bucket of a DCGM ratio: 0..100 (100 holds 1 and above). The nudge keeps
    whole percents whole (0.29 * 100 is 28.999...)."""
    if ratio >= 1.0:
        return BUCKETS - 1
    if ratio <= 0.0:
        return 0
    return int(ratio * 100 + 1e-9)


def workload_of(row: Mapping[Any, Any]) -> str:
    """What right-sizing advises on: the pod's owner, else the pod."""
    return str(row["owner_name"] or row["pod"] or "")


def contributions(
    row: Mapping[Any, Any], start: datetime, end: datetime, seconds: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A raw row's part covering ``seconds`` of ``[start, end]``: its summary values and its
    histogram rows (key columns included, the bucket's column not)."""
    key = {"namespace": row["namespace"] or "", "workload": workload_of(row)}
    period = row["job_type"] == _TRAINING and row["period_seconds"] is not None
    summary = {
        **key,
        "gpu_model": row.get("gpu_model") or "",
        "mig_profile": row.get("mig_profile") or "",
        "covered_seconds": seconds,
        "idle_gpu_seconds": seconds * (row["util_idle_fraction"] or 0.0),
        "util_max": row["util_max"],
        "fb_used_max_mib": row["fb_used_max_mib"],
        "first_start": start,
        "last_end": end,
        "period_covered_seconds": seconds if period else 0.0,
    }
    histogram = [
        {**key, "metric": metric, "percent": percent_bucket(row[column]), "seconds": seconds}
        for metric, column in METRICS.items()
        if row.get(column) is not None and seconds > 0
    ]
    return summary, histogram


def _row_pieces(row: Mapping[str, Any], tier: Tier) -> Iterator[tuple[datetime, float, Any]]:
    """(bucket start, seconds, (start, end) of the part) of a row's covered time per bucket."""
    end = row["at"]
    start = end - timedelta(microseconds=covers_microseconds(row["covers_seconds"]))
    size = timedelta(seconds=tier.seconds)
    for bucket, seconds in pieces(end, row["covers_seconds"], tier.seconds):
        yield bucket, seconds, (max(start, bucket), min(end, bucket + size))


def merge_values(kept: dict[str, Any], new: Mapping[str, Any], values: Mapping[str, Merge]) -> None:
    """``new``'s values merged into ``kept`` as the upsert merges them (NULL never wins)."""
    for column, how in values.items():
        old, value = kept[column], new[column]
        if old is None or value is None:
            kept[column] = value if old is None else old
        elif how is Merge.ADD:
            kept[column] = old + value
        elif how is Merge.LARGER:
            kept[column] = max(old, value)
        elif how is Merge.SMALLER:
            kept[column] = min(old, value)
        else:
            kept[column] = value


def activity_rows(tier: Tier, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The upserts of one cycle's ``gpu_window`` rows (those of a pod) into ``tier``: one per
    key (a workload's GPUs merge here), in key order (see the module's note on locks)."""
    summary = tier in SUMMARY_TIERS
    merged_rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        if row["pod"] is None:
            continue
        for bucket, seconds, (start, end) in _row_pieces(row, tier):
            part, histogram = contributions(row, start, end, seconds)
            for entry in [part] if summary else histogram:
                key = (bucket, *(entry[column] for column in tier.key))
                kept = merged_rows.get(key)
                if kept is None:
                    merged_rows[key] = {tier.column: bucket, **entry}
                elif summary:
                    merge_values(kept, entry, SUMMARY_VALUES)
                else:
                    kept["seconds"] += entry["seconds"]
    return [merged_rows[key] for key in sorted(merged_rows)]


def overlap_seconds(row: Mapping[Any, Any], low: datetime, high: datetime) -> float | None:
    """Seconds of the row's covered time ``(at - covers, at]`` inside ``[low, high)``, in whole
    microseconds as the rollups split it; None when it has none (a row covering nothing counts,
    with 0 s, where its ``at`` is)."""
    end = microseconds(row["at"])
    covers = covers_microseconds(row["covers_seconds"])
    lower, upper = microseconds(low), microseconds(high)
    overlap = min(end, upper) - max(end - covers, lower)
    if overlap > 0:
        return overlap / MICROSECONDS
    if covers == 0 and lower <= end < upper:
        return 0.0
    return None


def activity_statement(database: Database, tier: Tier, columns: Iterable[str]) -> str:
    """The upsert of one row into ``tier``: sums add up, peaks keep the larger."""
    values = SUMMARY_VALUES if tier in SUMMARY_TIERS else HISTOGRAM_VALUES
    return tier_upsert(database, tier, columns, values)
