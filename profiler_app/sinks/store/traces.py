"""Nsight Systems trace summaries in the table store, next to the continuous profile.

``TraceStore.record`` writes one ``trace_gpu`` row per GPU of a report, replacing the rows of
an earlier run on the same report (same pod, node and capture start) in one transaction.
``TraceStore.profiler_period`` reads the iteration period the continuous profiler last found
for a pod, to show beside the trace's own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from profiler_app.sinks.store.models import gpu_window, trace_gpu
from profiler_app.sinks.store.opened import OpenedStore
from profiler_app.trace.summary import GpuTrace, TraceSummary

UNKNOWN = ""  # namespace, pod or node not given: a key column cannot be NULL


class TraceStore(OpenedStore):
    def profiler_period(self, namespace: str, pod: str) -> float | None:
        """The period of the pod's latest training window in the continuous profile, if any."""
        query = (
            select(gpu_window.c.period_seconds)
            .where(
                gpu_window.c.namespace == namespace,
                gpu_window.c.pod == pod,
                gpu_window.c.period_seconds.is_not(None),
            )
            .order_by(gpu_window.c.at.desc())
            .limit(1)
        )
        try:
            with self._engine.connect() as connection:
                period = connection.execute(query).scalar()
        except SQLAlchemyError as error:
            raise self._error(error) from None
        return float(period) if period is not None else None

    def record(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        key = rows[0]
        try:
            with self._engine.begin() as connection:
                connection.execute(
                    delete(trace_gpu).where(
                        trace_gpu.c.namespace == key["namespace"],
                        trace_gpu.c.pod == key["pod"],
                        trace_gpu.c.node == key["node"],
                        trace_gpu.c.started_at == key["started_at"],
                    )
                )
                connection.execute(insert(trace_gpu), rows)
        except SQLAlchemyError as error:
            raise self._error(error) from None


def trace_rows(
    summary: TraceSummary,
    *,
    namespace: str | None,
    pod: str | None,
    node: str | None,
    started_at: datetime,
    recorded_at: datetime | None = None,
) -> list[dict[str, Any]]:
    """The ``trace_gpu`` rows of a summary, one per GPU."""
    key = {
        "namespace": namespace or UNKNOWN,
        "pod": pod or UNKNOWN,
        "node": node or UNKNOWN,
        "started_at": started_at,
        "report": summary.report[-1024:],
        "recorded_at": recorded_at or datetime.now(UTC),
        "profiler_period_seconds": summary.profiler_period_seconds,
    }
    return [{**key, **_gpu_columns(gpu)} for gpu in summary.gpus]


def _gpu_columns(gpu: GpuTrace) -> dict[str, Any]:
    return {
        "device": gpu.device,
        "gpu_name": gpu.name[:256] if gpu.name else None,
        "uuid": gpu.uuid[:64] if gpu.uuid else None,
        "span_seconds": gpu.span_ns / 1e9,
        "busy_fraction": gpu.busy_fraction,
        "idle_gap_count": gpu.gaps.count,
        "idle_total_seconds": gpu.gaps.total_ns / 1e9,
        "idle_longest_seconds": gpu.gaps.longest_ns / 1e9,
        "kernel_count": sum(k.count for k in gpu.kernels),
        "kernel_seconds": sum(k.total_ns for k in gpu.kernels) / 1e9,
        "memory_seconds": sum(m.total_ns for m in gpu.memory) / 1e9,
        "memory_bytes": sum(m.bytes or 0 for m in gpu.memory),
        "pageable_seconds": sum(m.pageable_ns for m in gpu.memory) / 1e9,
        "launch_api_seconds": gpu.launch_ns / 1e9,
        "sync_api_seconds": gpu.sync_ns / 1e9,
        "iteration_seconds": gpu.iteration.seconds if gpu.iteration else None,
        "verdict": gpu.verdict.name,
        "evidence": "\n".join(gpu.verdict.evidence),
        "top_kernel": gpu.kernels[0].name if gpu.kernels else None,
    }
