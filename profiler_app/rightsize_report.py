"""``report --by rightsize``: the right-sizing engine (``profiler_app.rightsizing``) fed from the
store's history, one advice per workload.

Each ``gpu_window`` row is a window's profile of one GPU (or MIG instance) of a pod; a workload
is the pod's owner (``owner_name``, else the pod). Its measurements over ``[since, until]``,
each row weighted by the time it covers:

- peak framebuffer: the largest window peak;
- p95 SM activity: the p95 of the windows' p95s (``sm_active_p95``); the median activity: the
  median of the windows' means (a window's median is not stored; its mean is at least the median
  of bursty work, so burstiness is if anything under-called);
- p95 DRAM activity: the p95 of the windows' p95s;
- active fraction: one less the covered-time-weighted idle fraction;
- history: from the start of the first row's covered time to the last row;
- cycle seen: a training window found its period, or the peak of the windows' utilisation lies
  inside the history (it rose and fell, not cut off at an end);
- the GPU model and current MIG profile of its latest row.

Raw rows only: retention (``--retention``) bounds how far back the advice sees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Connection, select

from profiler_app.rightsizing import Advice, Verdict, WorkloadUsage, model_for, recommend
from profiler_app.rightsizing.advice import peak_inside
from profiler_app.sinks.store.models import gpu_window

_TRAINING = "training"


@dataclass
class _Rows:
    """One workload's rows, in time order."""

    namespace: str
    workload: str
    weights: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    fb: list[float] = field(default_factory=list)
    sm_p95: list[float] = field(default_factory=list)
    sm_mean: list[float] = field(default_factory=list)
    dram_p95: list[float] = field(default_factory=list)
    idle: list[float] = field(default_factory=list)
    util_max: list[float] = field(default_factory=list)
    period_found: bool = False
    gpu_model: str = ""
    mig_profile: str | None = None


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` each counting ``weight`` (NaN values left out); NaN when
    none is left."""
    array, weight = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    keep = np.isfinite(array) & (weight > 0)
    if not keep.any():
        return math.nan
    order = np.argsort(array[keep], kind="stable")
    sorted_values, cumulative = array[keep][order], np.cumsum(weight[keep][order])
    index = int(np.searchsorted(cumulative, q * cumulative[-1], side="left"))
    return float(sorted_values[min(index, sorted_values.size - 1)])


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _collect(rows: Any) -> dict[tuple[str, str], _Rows]:
    found: dict[tuple[str, str], _Rows] = {}
    for row in rows:
        name = row.owner_name or row.pod
        key = (row.namespace or "", name)
        usage = found.setdefault(key, _Rows(*key))
        covers = max(float(row.covers_seconds), 0.0)
        end = row.at.timestamp()
        usage.weights.append(covers or 1e-6)  # a row covering nothing still counts a little
        usage.starts.append(end - covers)
        usage.ends.append(end)
        usage.fb.append(_number(row.fb_used_max_mib))
        usage.sm_p95.append(_number(row.sm_active_p95))
        usage.sm_mean.append(_number(row.sm_active_mean))
        usage.dram_p95.append(_number(row.dram_active_p95))
        usage.idle.append(_number(row.util_idle_fraction))
        usage.util_max.append(_number(row.util_max))
        usage.period_found |= row.job_type == _TRAINING and row.period_seconds is not None
        usage.gpu_model = row.gpu_model or usage.gpu_model
        usage.mig_profile = row.mig_profile or None
    return found


def _usage(rows: _Rows) -> WorkloadUsage | str:
    """What the engine needs, or why it cannot have it."""
    sm_p95 = weighted_quantile(rows.sm_p95, rows.weights, 0.95)
    if math.isnan(sm_p95):
        return "no SM activity in the store (DCGM_FI_PROF_SM_ACTIVE not exported)"
    idle = np.asarray(rows.idle, dtype=float)
    weights = np.asarray(rows.weights, dtype=float)
    known = np.isfinite(idle)
    idle_fraction = float(np.average(idle[known], weights=weights[known])) if known.any() else 0.0
    fb = [value for value in rows.fb if math.isfinite(value)]
    dram = weighted_quantile(rows.dram_p95, rows.weights, 0.95)
    median = weighted_quantile(rows.sm_mean, rows.weights, 0.5)
    return WorkloadUsage(
        namespace=rows.namespace,
        workload=rows.workload,
        gpu_model=rows.gpu_model,
        peak_fb_mib=max(fb, default=0.0),
        sm_active_p95=sm_p95,
        sm_active_p50=0.0 if math.isnan(median) else median,
        dram_active_p95=0.0 if math.isnan(dram) else dram,
        active_fraction=1.0 - idle_fraction,
        history_seconds=max(rows.ends) - min(rows.starts),
        cycle_seen=rows.period_found or peak_inside(rows.util_max),
        current_profile=rows.mig_profile,
    )


def _without_advice(rows: _Rows, reason: str) -> Advice:
    usage = WorkloadUsage(
        rows.namespace, rows.workload, rows.gpu_model, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
    )
    return Advice(usage=usage, verdict=Verdict.NOT_ENOUGH_HISTORY, reason=reason)


def rightsize_advice(
    connection: Connection,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
    headroom: float | None = None,
) -> list[Advice]:
    """One advice per workload seen on a GPU in ``(since, until]`` (raw rows), by namespace and
    workload."""
    c = gpu_window.c
    query = (
        select(
            c.at,
            c.covers_seconds,
            c.namespace,
            c.pod,
            c.owner_name,
            c.job_type,
            c.period_seconds,
            c.util_max,
            c.util_idle_fraction,
            c.fb_used_max_mib,
            c.sm_active_p95,
            c.sm_active_mean,
            c.dram_active_p95,
            c.gpu_model,
            c.mig_profile,
        )
        .where(c.at > since, c.at <= until, c.pod.is_not(None))
        .order_by(c.at, c.id)
    )
    if node is not None:
        query = query.where(c.node == node)
    advices = []
    for _, rows in sorted(_collect(connection.execute(query)).items()):
        usage = _usage(rows)
        if isinstance(usage, str):
            advices.append(_without_advice(rows, usage))
            continue
        model = model_for(usage.gpu_model) if usage.gpu_model else None
        if model is not None and usage.current_profile and not model.profile(usage.current_profile):
            reason = f"profile {usage.current_profile} is not in the {model.key} table"
            advices.append(_without_advice(rows, reason))
            continue
        extra = {} if headroom is None else {"headroom": headroom}
        advices.append(recommend(usage, model, **extra))
    return advices
