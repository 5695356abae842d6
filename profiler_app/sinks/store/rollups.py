"""Hourly and daily rollups of the raw rows, written in the same transaction as the rows.

A ``gpu_window`` row stands for the time ``(at - covers_seconds, at]``. Each bucket of a rollup
(an hour of ``gpu_hour`` and ``pod_hour``, a day of ``gpu_day`` and ``gpu_job_day``) gets the
part of that time that falls inside it, so a row covering 10:59:45 to 11:00:15 adds 15 s to
each hour. Times count in whole microseconds, as they are stored, and the report's SQL on raw
rows (``history.py``) splits them the same way: the report over whole buckets from rollups and
over the partial ones at the edges from raw rows adds up to the report from raw rows alone. A
row that covers nothing (``covers_seconds`` 0) belongs to the bucket holding its ``at``.

Each cycle upserts into the current buckets: covered and idle seconds add up, peaks keep the
larger. The key holds everything the report groups by (GPU, job type, pod, workload, whether
the window's memory was held; ``gpu_day`` whether a pod held the GPU, not which;
``gpu_job_day`` only GPU and job type), text keys as '' when unknown (a key column cannot be
NULL).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from profiler_app.core.model import HELD_MEMORY_MIB, PodUsage
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.schema import IO_DIRECTIONS, POD_HOUR_IO_COLUMNS, io_column
from profiler_app.sinks.store.statements import Merge, merged, upsert_statement

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECONDS = 1_000_000
HOUR_SECONDS = 3600
DAY_SECONDS = 86400


@dataclass(frozen=True)
class Tier:
    """One rollup table: its name, the column holding each bucket's start, the bucket length,
    and the columns after it that make a row's key."""

    table: str
    column: str
    seconds: int
    key: tuple[str, ...]


# gpu_hour: per GPU, job type, memory held, pod and workload. gpu_day serves only the report's
# whole days, whose views need to know whether a pod held the GPU, not which: one row per
# workload and day however many pods it ran (short jobs would make as many rows as hours).
GPU_HOUR_KEY = (
    "node",
    "gpu",
    "uuid",
    "gpu_i_id",  # revision 0009: a MIG instance ('' for a whole GPU)
    "job_type",
    "memory_held",
    "namespace",
    "pod",
    "owner_kind",
    "owner_name",
)
GPU_DAY_KEY = tuple("has_pod" if column == "pod" else column for column in GPU_HOUR_KEY)
# gpu_job_day: whole days per GPU and job type, for the node and GPU views, whose rows would
# otherwise grow with the workloads sharing a GPU's day (revision 0013).
GPU_JOB_DAY_KEY = GPU_HOUR_KEY[: GPU_HOUR_KEY.index("job_type") + 1]
POD_KEY = ("node", "namespace", "pod")
GPU_HOUR = Tier("gpu_hour", "hour", HOUR_SECONDS, GPU_HOUR_KEY)
GPU_DAY = Tier("gpu_day", "day", DAY_SECONDS, GPU_DAY_KEY)
POD_HOUR = Tier("pod_hour", "hour", HOUR_SECONDS, POD_KEY)
GPU_JOB_DAY = Tier("gpu_job_day", "day", DAY_SECONDS, GPU_JOB_DAY_KEY)
GPU_TIERS = (GPU_HOUR, GPU_DAY, GPU_JOB_DAY)
ROLLUP_TIERS = (*GPU_TIERS, POD_HOUR)

# gpu_hour, gpu_day and gpu_job_day: how each value column merges.
GPU_VALUES = {
    "covered_seconds": Merge.ADD,
    "idle_gpu_seconds": Merge.ADD,
    "util_max": Merge.LARGER,
    "mem_copy_util_max": Merge.LARGER,
    "fb_used_max_mib": Merge.LARGER,
    "covers_max_seconds": Merge.LARGER,
    "period_seconds_min": Merge.SMALLER,
    "period_seconds_max": Merge.LARGER,
    "period_covered_seconds": Merge.ADD,
    "period_weighted_sum": Merge.ADD,
}
POD_VALUES = {
    "owner_kind": Merge.KNOWN,
    "owner_name": Merge.KNOWN,
    "gpus": Merge.LARGER,
    "gpu_seconds": Merge.ADD,
    "idle_gpu_seconds": Merge.ADD,
    "util_max": Merge.LARGER,
    "mem_copy_util_max": Merge.LARGER,
    "fb_used_max_mib": Merge.LARGER,
    "cpu_util_max": Merge.LARGER,
    "mem_used_max_bytes": Merge.LARGER,
    **dict.fromkeys(POD_HOUR_IO_COLUMNS, Merge.LARGER),
}
_POD_PEAKS = ("util_max", "mem_copy_util_max", "fb_used_max_mib")


def microseconds(moment: datetime) -> int:
    """Whole microseconds since the Unix epoch (exact: datetimes hold microseconds)."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def covers_microseconds(seconds: float) -> int:
    """A row's covered time in whole microseconds, as the report's SQL rounds it."""
    return round(seconds * MICROSECONDS)


def bucket_start(moment: datetime, seconds: int) -> datetime:
    """The start of the bucket of length ``seconds`` holding ``moment``."""
    size = seconds * MICROSECONDS
    return EPOCH + timedelta(microseconds=microseconds(moment) // size * size)


def pieces(at: datetime, covers_seconds: float, seconds: int) -> Iterator[tuple[datetime, float]]:
    """(bucket start, seconds inside it) of the time ``(at - covers_seconds, at]``."""
    end = microseconds(at)
    start = end - covers_microseconds(covers_seconds)
    size = seconds * MICROSECONDS
    if start >= end:
        yield EPOCH + timedelta(microseconds=end // size * size), 0.0
        return
    for index in range(start // size, (end - 1) // size + 1):
        low, high = max(start, index * size), min(end, (index + 1) * size)
        yield EPOCH + timedelta(microseconds=index * size), (high - low) / MICROSECONDS


def memory_held(fb_used_max_mib: float | None) -> bool:
    """Whether the window's peak framebuffer shows memory held by a workload."""
    return fb_used_max_mib is not None and fb_used_max_mib >= HELD_MEMORY_MIB


def gpu_rollup_rows(tier: Tier, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The upserts of one cycle's ``gpu_window`` rows into ``tier`` (``GPU_TIERS``)."""
    upserts = []
    for row in rows:
        period = row["period_seconds"]
        idle_fraction = row["util_idle_fraction"] or 0.0
        key = {
            "node": row["node"],
            "gpu": row["gpu"],
            "uuid": row["uuid"],
            "gpu_i_id": row.get("gpu_i_id", ""),
            "job_type": row["job_type"],
            "memory_held": memory_held(row["fb_used_max_mib"]),
            "namespace": row["namespace"] or "",
            "owner_kind": row["owner_kind"] or "",
            "owner_name": row["owner_name"] or "",
        }
        if "pod" in tier.key:
            key["pod"] = row["pod"] or ""
        elif "has_pod" in tier.key:
            key["has_pod"] = row["pod"] is not None
        else:
            key = {column: key[column] for column in tier.key}
        for start, seconds in pieces(row["at"], row["covers_seconds"], tier.seconds):
            upserts.append(
                {
                    tier.column: start,
                    **key,
                    "covered_seconds": seconds,
                    "idle_gpu_seconds": seconds * idle_fraction,
                    "util_max": row["util_max"],
                    "mem_copy_util_max": row["mem_copy_util_max"],
                    "fb_used_max_mib": row["fb_used_max_mib"],
                    "covers_max_seconds": row["covers_seconds"],
                    "period_seconds_min": period,
                    "period_seconds_max": period,
                    "period_covered_seconds": seconds if period is not None else 0.0,
                    "period_weighted_sum": seconds * period if period is not None else 0.0,
                }
            )
    return upserts


def pod_rollup_rows(
    rows: Iterable[Mapping[str, Any]], pods: Iterable[PodUsage]
) -> list[dict[str, Any]]:
    """The upserts of one cycle into ``pod_hour``: each pod's GPU rows (the GPUs whose current
    pod it is) summed per hour, with the pod's CPU and memory peaks from the cycle."""
    host_peaks = {(pod.namespace, pod.pod): pod for pod in pods}
    merged_rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        if row["pod"] is None:
            continue
        usage = host_peaks.get((row["namespace"], row["pod"]))
        idle_fraction = row["util_idle_fraction"] or 0.0
        for start, seconds in pieces(row["at"], row["covers_seconds"], POD_HOUR.seconds):
            key = (start, row["node"], row["namespace"], row["pod"])
            kept = merged_rows.get(key)
            if kept is None:
                merged_rows[key] = {
                    "hour": start,
                    "node": row["node"],
                    "namespace": row["namespace"] or "",
                    "pod": row["pod"],
                    "owner_kind": row["owner_kind"],
                    "owner_name": row["owner_name"],
                    "gpus": 1,
                    "gpu_seconds": seconds,
                    "idle_gpu_seconds": seconds * idle_fraction,
                    **{peak: row[peak] for peak in _POD_PEAKS},
                    "cpu_util_max": usage.cpu_util_max if usage else None,
                    "mem_used_max_bytes": usage.mem_used_max_bytes if usage else None,
                    **_io_peaks(usage),
                }
                continue
            kept["gpus"] += 1
            kept["gpu_seconds"] += seconds
            kept["idle_gpu_seconds"] += seconds * idle_fraction
            kept["owner_kind"] = kept["owner_kind"] or row["owner_kind"]
            kept["owner_name"] = kept["owner_name"] or row["owner_name"]
            for peak in _POD_PEAKS:
                values = [value for value in (kept[peak], row[peak]) if value is not None]
                kept[peak] = max(values, default=None)
    return list(merged_rows.values())


def _io_peaks(usage: PodUsage | None) -> dict[str, float | None]:
    """The pod's disk and network peaks of the cycle's window, for each of its hours."""
    io = usage.io if usage is not None else None
    return {
        io_column(direction, "max"): io.stat(direction, "max") if io else None
        for direction in IO_DIRECTIONS
    }


def rollup_statement(database: Database, tier: Tier, columns: Iterable[str]) -> str:
    """The upsert of one row into ``tier``: sums add up, peaks keep the larger."""
    return tier_upsert(database, tier, columns, POD_VALUES if tier is POD_HOUR else GPU_VALUES)


def tier_upsert(
    database: Database, tier: Tier, columns: Iterable[str], values: Mapping[str, Any]
) -> str:
    """The upsert of one row into ``tier``, each of ``values``' columns merged as it says."""
    return upsert_statement(
        database,
        tier.table,
        columns,
        (tier.column, *tier.key),
        {column: merged(database, tier.table, column, how) for column, how in values.items()},
    )
