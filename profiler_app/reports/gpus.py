"""The node and GPU views: per GPU (or MIG instance) and per node of a range, hours per job type,
idle GPU-hours and peaks, from the relation of ``sinks/store/history.gpu_history``.

The GPU view sums per GPU and job type in the database and folds the job types into one summary
per GPU in Python. The node view alone sums per node and job type in the database, so that
Python reads a row per node and job type, not one per GPU and job type (25,500 rows at 8,500
GPUs): when the GPU view is wanted too, the nodes are added up from its GPUs instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, case, func, literal, select

# The classifier's job types (analysis.basis.JobType, a test holds them equal): named here so
# that report's start does not load the classifier and numpy.
JOB_TYPES = ("idle", "training", "inference", "bursty")
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
            h.job_type,
            func.max(h.uuid),
            func.sum(h.covered_seconds),
            func.sum(h.idle_gpu_seconds),
            func.max(h.util_max),
            func.max(h.mem_copy_util_max),
            func.max(h.fb_used_max_mib),
        ).group_by(h.node, h.gpu, h.gpu_i_id, h.job_type)
    ).all()  # fetched at once: row by row, the driver's fetchone cost 0.15 s at 25,000 rows
    summaries: dict[tuple[str, str, str], GpuSummary] = {}
    for node_name, gpu, instance, job_type, uuid, seconds, idle, util, mem_copy, fb in rows:
        summary = summaries.get((node_name, gpu, instance))
        if summary is None:
            summary = summaries[node_name, gpu, instance] = GpuSummary(
                node=node_name,
                gpu=gpu,
                uuid=uuid,
                mig_instance=instance,
                hours_by_job_type=dict.fromkeys(JOB_TYPES, 0.0),
                idle_gpu_hours=0.0,
                util_max_percent=util,
                mem_copy_util_max_percent=mem_copy,
                fb_used_max_mib=fb,
            )
        else:
            summary.uuid = max(summary.uuid, uuid)
            summary.util_max_percent = _larger(summary.util_max_percent, util)
            summary.mem_copy_util_max_percent = _larger(summary.mem_copy_util_max_percent, mem_copy)
            summary.fb_used_max_mib = _larger(summary.fb_used_max_mib, fb)
        hours = summary.hours_by_job_type
        hours[job_type] = hours.get(job_type, 0.0) + float(seconds) / _SECONDS_PER_HOUR
        summary.idle_gpu_hours += float(idle) / _SECONDS_PER_HOUR
    return sorted(
        summaries.values(),
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
    gpu = (h.node, h.gpu, h.gpu_i_id)
    # One row per GPU and job type, as gpu_summaries reads them; the first job type of each
    # GPU counts it, so a GPU counts once however many job types it had.
    first_of_gpu = func.row_number().over(partition_by=gpu, order_by=h.job_type) == 1
    per_gpu = (
        select(
            h.node,
            h.job_type,
            case((first_of_gpu, literal(1)), else_=literal(0)).label("first"),
            func.sum(h.covered_seconds).label("covered_seconds"),
            func.sum(h.idle_gpu_seconds).label("idle_gpu_seconds"),
            func.max(h.util_max).label("util_max"),
        )
        .group_by(*gpu, h.job_type)
        .subquery("per_gpu")
    )
    g = per_gpu.c
    rows = connection.execute(
        select(
            g.node,
            g.job_type,
            func.sum(g.first),
            func.sum(g.covered_seconds),
            func.sum(g.idle_gpu_seconds),
            func.max(g.util_max),
        ).group_by(g.node, g.job_type)
    ).all()
    nodes: dict[str, NodeSummary] = {}
    for node_name, job_type, gpus, seconds, idle, util in rows:
        summary = nodes.get(node_name)
        if summary is None:
            summary = nodes[node_name] = NodeSummary(
                node=node_name, gpus=0, hours_by_job_type=dict.fromkeys(JOB_TYPES, 0.0)
            )
        summary.gpus += int(gpus)
        hours = summary.hours_by_job_type
        hours[job_type] = hours.get(job_type, 0.0) + float(seconds) / _SECONDS_PER_HOUR
        summary.idle_gpu_hours += float(idle) / _SECONDS_PER_HOUR
        summary.util_max_percent = _larger(summary.util_max_percent, util)
    return sorted(nodes.values(), key=lambda s: s.node)


def _larger(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
