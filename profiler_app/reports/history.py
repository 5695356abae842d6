"""Summaries of the table store over a time range: per node, per GPU, per pod, idle pods, and
the idle GPU-hours people can act on (waste), the Nsight Systems traces recorded by
``gpu-profiler trace``, and the trials of ``gpu-profiler trial run``.

Hours per job type are the GPUs' covered time inside the range: each ``gpu_window`` row stands
for the time since the previous row of its GPU (``covers_seconds``, capped at the window), and
counts for the part of it inside the range. They are read from the hourly and daily rollups for
the whole hours and days of the range and from raw rows only for the partial hours at its edges
(``sinks/store/history.py``): the cost grows with GPUs x hours, not with rows. Idle GPU-hours
weight the same time by the row's idle fraction of GPU utilisation, so a bursty GPU that sat
idle half the time adds half its hours. Waste splits those idle GPU-hours by who could act on
them (``WASTE_KINDS``). Aggregation runs in the database; the node and GPU views' is in
``gpus.py``, the waste view's in ``waste.py``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Float, case, cast, literal, select

from profiler_app.reports.gpus import (
    JOB_TYPES,
    GpuSummary,
    NodeSummary,
    gpu_summaries,
    node_summaries,
    node_totals,
)
from profiler_app.reports.views import DEFAULT_IDLE_BELOW_PERCENT, REPORT_VIEWS
from profiler_app.reports.waste import WasteSummary, waste_summaries
from profiler_app.sinks.store.history import (
    epoch_microseconds,
    gpu_history,
    larger,
    smaller,
)
from profiler_app.sinks.store.models import pod_usage, trace_gpu, trial_result
from profiler_app.sinks.store.rollups import MICROSECONDS, microseconds
from profiler_app.sinks.store.schema import (
    IO_DIRECTIONS,
    IO_STATISTICS,
    UNKNOWN_START_TIME,
    io_column,
)

_SECONDS_PER_HOUR = 3600.0


@dataclass
class PodSummary:
    namespace: str
    pod: str
    node: str
    gpus: str
    start_time: datetime | None
    first_seen: datetime
    last_seen: datetime
    gpu_hours: float  # GPUs held x hours seen within the range
    gpu_util_max_percent: float | None
    gpu_mem_copy_util_max_percent: float | None
    fb_used_max_mib: float | None
    cpu_util_max_percent: float | None
    mem_used_max_bytes: float | None
    owner_kind: str | None = None
    owner_name: str | None = None
    # Disk and network bytes per second by report column (POD_IO_REPORT_COLUMNS), None where
    # not measured; whether the network could be told from the host's (None: not known).
    io: dict[str, float | None] = field(default_factory=dict)
    network_attributable: bool | None = None


@dataclass
class Report:
    since: datetime
    until: datetime
    nodes: list[NodeSummary]
    gpus: list[GpuSummary]
    pods: list[PodSummary]
    idle_pods: list[PodSummary]
    waste: list[WasteSummary] = field(default_factory=list)
    traces: list[dict[str, Any]] = field(default_factory=list)  # trace_gpu rows, newest first
    trials: list[dict[str, Any]] = field(default_factory=list)  # trial_result rows, newest first
    notes: list[str] = field(default_factory=list)  # e.g. an edge estimated from a rollup


def build_report(
    connection: Connection,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
    top: int | None = None,
    idle_below_percent: float = DEFAULT_IDLE_BELOW_PERCENT,
    views: Collection[str] = (),
    rollups: bool = True,
) -> Report:
    """The report for ``[since, until]`` (aware datetimes), optionally one node only.

    ``views``: the ones to compute (``REPORT_VIEWS``; empty: all). ``top`` limits the pod lists
    (largest GPU-hours first) and each kind of waste (most idle GPU-hours first); idle pods are
    pods holding GPUs whose peak GPU utilisation over their life stayed at or below
    ``idle_below_percent``. ``rollups`` False reads raw rows only
    (the reference the rollups are tested against).
    """
    wanted = set(views or REPORT_VIEWS)
    report = Report(since=since, until=until, nodes=[], gpus=[], pods=[], idle_pods=[])
    if connection.dialect.name == "postgresql":
        # These queries take a second at most: compiling them first (JIT) costs a quarter of it.
        connection.exec_driver_sql("SET LOCAL jit = off")
    for views_here, workloads in (({"node", "gpu"}, False), ({"waste"}, True)):
        if not wanted & views_here:
            continue
        # The node and GPU views need no workload: their whole days are one row per GPU and
        # job type (gpu_job_day) however many workloads shared them.
        history = gpu_history(
            connection, since=since, until=until, node=node, rollups=rollups, workloads=workloads
        )
        report.notes = history.notes
        if workloads:
            report.waste = waste_summaries(
                connection,
                history.relation,
                top,
                report.notes,
                whole_days=history.whole_days,
                ranking=history.idle,
                unowned=history.unowned,
            )
        elif "gpu" in wanted:
            report.gpus = gpu_summaries(connection, history.relation)
            if "node" in wanted:
                report.nodes = node_summaries(report.gpus)
        else:
            report.nodes = node_totals(connection, history.relation)
    if "pod" in wanted:
        report.pods = pod_summaries(connection, since=since, until=until, node=node, top=top)
    if "idle-pods" in wanted:
        report.idle_pods = pod_summaries(
            connection,
            since=since,
            until=until,
            node=node,
            top=top,
            idle_below_percent=idle_below_percent,
        )
    if "trace" in wanted:
        report.traces = trace_rows(connection, since=since, until=until, node=node)
    if "trial" in wanted:
        report.trials = trial_rows(connection, since=since, until=until)
    return report


def pod_summaries(
    connection: Connection,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
    top: int | None = None,
    idle_below_percent: float | None = None,
) -> list[PodSummary]:
    """Pods seen within the range, the most GPU-hours first (the ``top`` of them); with
    ``idle_below_percent``, only those whose peak GPU utilisation stayed at or below it."""
    dialect = connection.dialect.name
    seen_us = smaller(
        dialect, epoch_microseconds(dialect, pod_usage.c.last_seen), literal(microseconds(until))
    ) - larger(
        dialect, epoch_microseconds(dialect, pod_usage.c.first_seen), literal(microseconds(since))
    )
    seen_hours = case((seen_us > 0, cast(seen_us, Float)), else_=0.0) / (
        MICROSECONDS * _SECONDS_PER_HOUR
    )
    gpu_hours = (seen_hours * pod_usage.c.gpu_count).label("gpu_hours")
    query = select(pod_usage, gpu_hours).where(
        pod_usage.c.last_seen >= since, pod_usage.c.first_seen <= until, pod_usage.c.gpu_count > 0
    )
    if node is not None:
        query = query.where(pod_usage.c.node == node)
    if idle_below_percent is not None:
        query = query.where(pod_usage.c.gpu_util_max <= idle_below_percent)
    query = query.order_by(gpu_hours.desc(), pod_usage.c.namespace, pod_usage.c.pod)
    if top:
        query = query.limit(top)
    return [
        PodSummary(
            namespace=row["namespace"],
            pod=row["pod"],
            node=row["node"],
            gpus=row["gpus"],
            start_time=None
            if row["pod_start_time"] == UNKNOWN_START_TIME
            else row["pod_start_time"],
            first_seen=row["first_seen"],
            last_seen=row["last_seen"],
            gpu_hours=float(row["gpu_hours"]),
            gpu_util_max_percent=row["gpu_util_max"],
            gpu_mem_copy_util_max_percent=row["gpu_mem_copy_util_max"],
            fb_used_max_mib=row["fb_used_max_mib"],
            cpu_util_max_percent=row["cpu_util_max"],
            mem_used_max_bytes=row["mem_used_max_bytes"],
            owner_kind=row["owner_kind"],
            owner_name=row["owner_name"],
            io={
                report_column: row[store_column]
                for report_column, store_column in POD_IO_REPORT_COLUMNS.items()
            },
            network_attributable=None
            if row["network_attributable"] is None
            else bool(row["network_attributable"]),
        )
        for row in connection.execute(query).mappings()
    ]


def trace_rows(
    connection: Connection, *, since: datetime, until: datetime, node: str | None = None
) -> list[dict[str, Any]]:
    """Traces whose capture started within the range, newest first, in the view's columns."""
    columns = [trace_gpu.c[name] for name in _VIEW_COLUMNS["trace"]]
    query = select(*columns).where(trace_gpu.c.started_at >= since, trace_gpu.c.started_at <= until)
    if node is not None:
        query = query.where(trace_gpu.c.node == node)
    query = query.order_by(
        trace_gpu.c.started_at.desc(), trace_gpu.c.namespace, trace_gpu.c.pod, trace_gpu.c.device
    )
    return [dict(row) for row in connection.execute(query).mappings()]


def trial_rows(connection: Connection, *, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Trials of ``gpu-profiler trial run`` recorded within the range, newest run first."""
    columns = [trial_result.c[name] for name in _VIEW_COLUMNS["trial"]]
    query = (
        select(*columns)
        .where(trial_result.c.recorded_at >= since, trial_result.c.recorded_at <= until)
        .order_by(
            trial_result.c.recorded_at.desc(),
            trial_result.c.run_id,
            trial_result.c.gpus,
            trial_result.c.trial,
        )
    )
    return [dict(row) for row in connection.execute(query).mappings()]


# The pod view's disk and network columns (unit last, as the other columns) by store column.
POD_IO_REPORT_COLUMNS = {
    f"{direction}_{statistic}_bytes_per_second": io_column(direction, statistic)
    for direction in IO_DIRECTIONS
    for statistic in IO_STATISTICS
}
_HOURS_COLUMNS = ["covered_hours", *(f"{job_type}_hours" for job_type in JOB_TYPES), "other_hours"]
_VIEW_COLUMNS = {
    "node": ["node", "gpus", *_HOURS_COLUMNS, "idle_gpu_hours", "util_max_percent"],
    "gpu": [
        "node",
        "gpu",
        "uuid",
        "mig_instance",
        *_HOURS_COLUMNS,
        "idle_gpu_hours",
        "util_max_percent",
        "mem_copy_util_max_percent",
        "fb_used_max_mib",
    ],
    "pod": [
        "namespace",
        "pod",
        "node",
        "gpus",
        "gpu_hours",
        "gpu_util_max_percent",
        "gpu_mem_copy_util_max_percent",
        "fb_used_max_mib",
        "cpu_util_max_percent",
        "mem_used_max_bytes",
        "start_time",
        "first_seen",
        "last_seen",
        "owner_kind",
        "owner_name",
        # Added after the others, so a CSV reader by position keeps working.
        *POD_IO_REPORT_COLUMNS,
        "network_attributable",
    ],
    "waste": ["kind", "namespace", "owner_kind", "owner_name", "gpus", "idle_gpu_hours"],
}
_VIEW_COLUMNS["idle-pods"] = _VIEW_COLUMNS["pod"]
_VIEW_COLUMNS["trace"] = [
    "namespace",
    "pod",
    "node",
    "started_at",
    "device",
    "gpu_name",
    "verdict",
    "busy_fraction",
    "span_seconds",
    "idle_total_seconds",
    "iteration_seconds",
    "profiler_period_seconds",
    "top_kernel",
]


_VIEW_COLUMNS["trial"] = [
    "run_id",
    "recorded_at",
    "workload",
    "trial",
    "placement",
    "status",
    "estimator",
    "throughput",
    "unit",
    "throughput_per_gpu",
    "scaling_efficiency",
    "gpu_seconds",
    "pareto",
    "recommended",
]


def view_columns(by: str) -> list[str]:
    """Column names of a view, also when it has no rows (CSV header, empty table)."""
    return list(_VIEW_COLUMNS[by])


def report_rows(report: Report, by: str) -> list[dict[str, Any]]:
    """One view of the report as flat rows (the same columns in every output format)."""
    if by == "trace":
        return [dict(row) for row in report.traces]
    if by == "trial":
        return [dict(row) for row in report.trials]
    if by == "node":
        return [
            {
                "node": n.node,
                "gpus": n.gpus,
                **_hours_columns(n.hours_by_job_type),
                "idle_gpu_hours": n.idle_gpu_hours,
                "util_max_percent": n.util_max_percent,
            }
            for n in report.nodes
        ]
    if by == "gpu":
        return [
            {
                "node": g.node,
                "gpu": g.gpu,
                "uuid": g.uuid,
                "mig_instance": g.mig_instance,
                **_hours_columns(g.hours_by_job_type),
                "idle_gpu_hours": g.idle_gpu_hours,
                "util_max_percent": g.util_max_percent,
                "mem_copy_util_max_percent": g.mem_copy_util_max_percent,
                "fb_used_max_mib": g.fb_used_max_mib,
            }
            for g in report.gpus
        ]
    if by == "waste":
        # Its fields are the view's columns. Not asdict: its deep copies took 0.1-0.2 s for the
        # 12,500 rows of 8,000 GPUs over 30 days.
        return [vars(waste).copy() for waste in report.waste]
    pods = report.pods if by == "pod" else report.idle_pods
    return [
        {
            "namespace": p.namespace,
            "pod": p.pod,
            "node": p.node,
            "gpus": p.gpus,
            "gpu_hours": p.gpu_hours,
            "gpu_util_max_percent": p.gpu_util_max_percent,
            "gpu_mem_copy_util_max_percent": p.gpu_mem_copy_util_max_percent,
            "fb_used_max_mib": p.fb_used_max_mib,
            "cpu_util_max_percent": p.cpu_util_max_percent,
            "mem_used_max_bytes": p.mem_used_max_bytes,
            "start_time": p.start_time,
            "first_seen": p.first_seen,
            "last_seen": p.last_seen,
            "owner_kind": p.owner_kind,
            "owner_name": p.owner_name,
            **{column: p.io.get(column) for column in POD_IO_REPORT_COLUMNS},
            "network_attributable": p.network_attributable,
        }
        for p in pods
    ]


def _hours_columns(hours_by_job_type: dict[str, float]) -> dict[str, float]:
    columns = {"covered_hours": sum(hours_by_job_type.values())}
    columns |= {f"{job_type}_hours": hours_by_job_type.get(job_type, 0.0) for job_type in JOB_TYPES}
    columns["other_hours"] = sum(
        (hours for job_type, hours in hours_by_job_type.items() if job_type not in JOB_TYPES),
        0.0,
    )
    return columns
