"""The node and GPU views: per GPU (or MIG instance) and per node of a range, hours per job type,
idle GPU-hours and peaks, from the relation of ``sinks/store/history.gpu_history``.

Both sum in the database, a column per job type, so that Python reads one row per GPU (8,500)
or per node (1,000), not one per GPU and job type (25,500 at 8,500 GPUs). When the GPU view is
wanted too, the nodes are added up from its GPUs instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, case, func, literal, select

# The classifier's job types (analysis.basis.JobType, a test holds them equal): named here so
# that report's start does not load the classifier and numpy.
JOB_TYPES = ("idle", "training", "inference", "bursty")
# The hours of any other job type a store holds (a newer classifier's), summed under one key: the
# views show them as one column, ``other_hours``.
OTHER_JOB_TYPE = "other"
_PIVOTED = len(JOB_TYPES) + 1
_SECONDS_PER_HOUR = 3600.0


@dataclass
class GpuSummary:
    node: str
    gpu: str
    uuid: str
    hours_by_job_type: dict[str, float]
    idle_gpu_hours: float
    util_max_percent: float | None
    mem_copy_util_max_percent: float | None
    fb_used_max_mib: float | None
    mig_instance: str = ""  # GPU_I_ID of a MIG instance, '' for a whole GPU


@dataclass
class NodeSummary:
    node: str
    gpus: int
    hours_by_job_type: dict[str, float] = field(default_factory=dict)
    idle_gpu_hours: float = 0.0
    util_max_percent: float | None = None


def gpu_summaries(connection: Connection, history: Any) -> list[GpuSummary]:
    """Per GPU of ``history`` (``history.gpu_history``'s relation): hours per job type, idle
    GPU-hours and peaks."""
    h = history.c
    rows = connection.execute(
        select(
            h.node,
            h.gpu,
            h.gpu_i_id,
            func.max(h.uuid),
            *_seconds_by_job_type(h),
            func.sum(h.idle_gpu_seconds),
            func.max(h.util_max),
            func.max(h.mem_copy_util_max),
            func.max(h.fb_used_max_mib),
        ).group_by(h.node, h.gpu, h.gpu_i_id)
    ).all()  # fetched at once: row by row, the driver's fetchone cost 0.15 s at 25,000 rows
    summaries = [
        GpuSummary(
            node=row[0],
            gpu=row[1],
            uuid=row[3],
            mig_instance=row[2],
            hours_by_job_type=_hours(row[4 : 4 + _PIVOTED]),
            idle_gpu_hours=float(row[-4]) / _SECONDS_PER_HOUR,
            util_max_percent=row[-3],
            mem_copy_util_max_percent=row[-2],
            fb_used_max_mib=row[-1],
        )
        for row in rows
    ]
    return sorted(
        summaries,
        key=lambda s: (s.node, _gpu_order(s.gpu), s.mig_instance != "", _gpu_order(s.mig_instance)),
    )


def node_summaries(gpus: list[GpuSummary]) -> list[NodeSummary]:
    """The nodes of the GPU view's summaries, added up."""
    nodes: dict[str, NodeSummary] = {}
    for gpu in gpus:
        summary = nodes.setdefault(gpu.node, NodeSummary(node=gpu.node, gpus=0))
        summary.gpus += 1
        for job_type, hours in gpu.hours_by_job_type.items():
            summary.hours_by_job_type[job_type] = (
                summary.hours_by_job_type.get(job_type, 0.0) + hours
            )
        summary.idle_gpu_hours += gpu.idle_gpu_hours
        if gpu.util_max_percent is not None:
            summary.util_max_percent = max(summary.util_max_percent or 0.0, gpu.util_max_percent)
    return sorted(nodes.values(), key=lambda s: s.node)


def node_totals(connection: Connection, history: Any) -> list[NodeSummary]:
    """The node view without the GPU view: ``node_summaries`` of ``gpu_summaries``, summed in
    the database (to rounding: the sums add in another order)."""
    h = history.c
    per_gpu = (
        select(
            h.node,
            *(total.label(f"seconds_{n}") for n, total in enumerate(_seconds_by_job_type(h))),
            func.sum(h.idle_gpu_seconds).label("idle_gpu_seconds"),
            func.max(h.util_max).label("util_max"),
        )
        .group_by(h.node, h.gpu, h.gpu_i_id)
        .subquery("per_gpu")
    )
    g = per_gpu.c
    rows = connection.execute(
        select(
            g.node,
            func.count(),
            *(func.sum(g[f"seconds_{n}"]) for n in range(_PIVOTED)),
            func.sum(g.idle_gpu_seconds),
            func.max(g.util_max),
        ).group_by(g.node)
    ).all()
    nodes = [
        NodeSummary(
            node=row[0],
            gpus=int(row[1]),
            hours_by_job_type=_hours(row[2 : 2 + _PIVOTED]),
            idle_gpu_hours=float(row[-2]) / _SECONDS_PER_HOUR,
            util_max_percent=row[-1],
        )
        for row in rows
    ]
    return sorted(nodes, key=lambda s: s.node)


def _seconds_by_job_type(h: Any) -> list[ColumnElement[Any]]:
    """The covered seconds summed per job type, a column each (JOB_TYPES, then OTHER_JOB_TYPE):
    a row per GPU rather than per GPU and job type, for Python to read (8,500 rows, not 25,500)."""
    zero = literal(0.0)
    return [
        *(
            func.sum(case((h.job_type == job_type, h.covered_seconds), else_=zero))
            for job_type in JOB_TYPES
        ),
        func.sum(case((h.job_type.in_(JOB_TYPES), zero), else_=h.covered_seconds)),
    ]


def _hours(seconds: Sequence[Any]) -> dict[str, float]:
    hours = {
        job_type: float(value) / _SECONDS_PER_HOUR
        for job_type, value in zip(JOB_TYPES, seconds, strict=False)
    }
    if other := seconds[len(JOB_TYPES)]:
        hours[OTHER_JOB_TYPE] = float(other) / _SECONDS_PER_HOUR
    return hours


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
