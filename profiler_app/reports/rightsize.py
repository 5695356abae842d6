"""``report --by rightsize``: the right-sizing engine (``reports.rightsizing``) fed from the
store's history, one advice per workload.

A workload is the pod's owner (``owner_name``, else the pod). What it needs over ``[since,
until)`` is merged from right-sizing's rollups (``sinks/store/activity.py``) for the whole days
and hours inside the range, and from the raw rows only for the partial hours at its edges (the
spans of ``history.py``), each raw row counting for its covered time inside them:

- peak framebuffer: the largest window peak;
- p95 SM activity: the covered-time-weighted p95 of the windows' p95s, from the merged
  histogram (1 %-wide buckets: the bucket's lower edge, at most one point under the raw rows;
  complete buckets' histograms are packed, one row per workload, and summed with numpy in
  ``histograms.py``, with the rows not packed yet);
  the median activity: the median of the windows' means (a window's median is not stored; its
  mean is at least the median of bursty work, so burstiness is if anything under-called);
- p95 DRAM activity: the p95 of the windows' p95s;
- active fraction: one less the idle share of the covered time;
- history: from the first to the last moment covered inside the range;
- cycle seen: a training window found its period, or the peak of the utilisation (per bucket,
  and per raw row at the edges) lies inside the history (it rose and fell, not cut off);
- the GPU model and MIG profile of its latest bucket.

Where retention removed the raw rows of an edge hour, that hour's rollups count in proportion
to the part of it inside the range.

With ``top``, the workloads are ranked by covered time first, summed in SQL from the
summaries and the edges' raw rows, and only the listed ones' histograms and raw rows are read:
at fleet scale the histograms of every workload are most of the cost.

The rollups are per workload, not per GPU or node (revision 0011), so ``--node`` reads the raw
rows of that node alone: the part of the range before retention removed them is left out, and
a note says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, Table, func, literal, or_, select, union_all

from profiler_app.reports.histograms import Histograms
from profiler_app.reports.rightsizing import Advice, Verdict, WorkloadUsage, model_for, recommend
from profiler_app.reports.rightsizing.advice import peak_inside
from profiler_app.sinks.store.activity import METRICS, contributions, overlap_seconds, workload_of
from profiler_app.sinks.store.history import Span, longest_covers, raw_time_inside, spans
from profiler_app.sinks.store.models import (
    activity_day,
    activity_day_packed,
    activity_hour,
    activity_hour_packed,
    gpu_window,
    rightsize_day,
    rightsize_hour,
    store_horizon,
)
from profiler_app.sinks.store.rollups import DAY_SECONDS, HOUR_SECONDS, bucket_start

_ONE_MICROSECOND = timedelta(microseconds=1)


@dataclass
class _Usage:
    """One workload's measurements merged over the range's parts."""

    namespace: str
    workload: str
    row: int  # its histograms' row in the merge's Histograms
    covered: float = 0.0
    idle: float = 0.0
    fb: float | None = None
    first: datetime | None = None
    last: datetime | None = None
    period_seconds: float = 0.0
    peaks: list[tuple[datetime, float]] = field(default_factory=list)  # (when, util_max)
    latest: tuple[datetime, str | None, str | None] | None = None  # (when, model, MIG profile)
    model: tuple[datetime, str] | None = None  # the latest known GPU model

    def add(self, row: Any, share: float = 1.0) -> None:
        """A part's summary: covered seconds and the rest, the model and profile it ran as."""
        self.covered += float(row.covered_seconds) * share
        self.idle += float(row.idle_gpu_seconds) * share
        self.period_seconds += float(row.period_covered_seconds) * share
        if row.fb_used_max_mib is not None:
            self.fb = max(self.fb or 0.0, float(row.fb_used_max_mib))
        first, last = row.first_start, row.last_end
        self.first = first if self.first is None else min(self.first, first)
        self.last = last if self.last is None else max(self.last, last)
        if self.latest is None or last >= self.latest[0]:
            self.latest = (last, row.gpu_model, row.mig_profile)
        if row.gpu_model and (self.model is None or last >= self.model[0]):
            self.model = (last, row.gpu_model)


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` each counting ``weight`` (NaN values and weights of 0
    left out): the first value, in order, where the cumulative weight reaches ``q`` of the
    total; NaN when none is left."""
    kept = sorted(
        (value, weight)
        for value, weight in zip(values, weights, strict=True)
        if math.isfinite(value) and weight > 0
    )
    if not kept:
        return math.nan
    target, cumulative = q * math.fsum(weight for _, weight in kept), 0.0
    for value, weight in kept:
        cumulative += weight
        if cumulative >= target:
            return value
    return kept[-1][0]


def histogram_quantile(histogram: Sequence[float] | None, q: float) -> float:
    """The ``q`` quantile of a 1 %-wide bucket histogram: the lower edge of the bucket where
    the cumulative time reaches ``q`` of the total; NaN when it holds no time."""
    if not histogram:
        return math.nan
    return weighted_quantile([index / 100 for index in range(len(histogram))], histogram, q)


def _usage(usage: _Usage, sm_p95: float, median: float, dram: float) -> WorkloadUsage | str:
    """What the engine needs (given its quantiles: NaN where no time), or why it cannot
    have it."""
    if math.isnan(sm_p95):
        return "no SM activity in the store (DCGM_FI_PROF_SM_ACTIVE not exported)"
    idle_fraction = usage.idle / usage.covered if usage.covered > 0 else 0.0
    peaks = [peak for _, peak in sorted(usage.peaks, key=lambda item: item[0])]
    assert usage.first is not None
    assert usage.last is not None
    assert usage.latest is not None
    return WorkloadUsage(
        namespace=usage.namespace,
        workload=usage.workload,
        gpu_model=usage.model[1] if usage.model else "",
        peak_fb_mib=usage.fb or 0.0,
        sm_active_p95=sm_p95,
        sm_active_p50=0.0 if math.isnan(median) else median,
        dram_active_p95=0.0 if math.isnan(dram) else dram,
        active_fraction=1.0 - idle_fraction,
        history_seconds=(usage.last - usage.first).total_seconds(),
        cycle_seen=usage.period_seconds > 0 or peak_inside(peaks),
        current_profile=usage.latest[2] or None,
    )


def _without_advice(usage: _Usage, reason: str) -> Advice:
    model = usage.model[1] if usage.model else ""
    empty = WorkloadUsage(
        usage.namespace, usage.workload, model, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, False
    )
    return Advice(usage=empty, verdict=Verdict.NOT_ENOUGH_HISTORY, reason=reason)


# The histograms' and raw rows' answers are read in batches (a server-side cursor on
# PostgreSQL): a month of a fleet's buckets would otherwise sit in memory twice, as the driver's
# rows and as the merged histograms.
STREAMED = {"yield_per": 10_000}
# Packed rows are about 1 kB each, and decoded a batch at a time: smaller batches.
STREAMED_PACKED = {"yield_per": 1_000}
# Above this many listed workloads, every workload's rows are read and the others dropped in
# Python, rather than binding that many names into each query.
_NAMES_FILTERED = 1000
# Up to this many buckets (a year of days), listed workloads are looked up bucket by bucket.
_BUCKETS_LISTED = 400


class _Merge:
    """The workloads of a range, merged part by part."""

    def __init__(
        self, connection: Connection, node: str | None, only: set[tuple[str, str]] | None = None
    ) -> None:
        self.connection = connection
        self.node = node
        self.only = only
        # The names the queries filter on (a superset: a name may be another namespace's).
        self.names = (
            sorted({workload for _, workload in only})
            if only is not None and len(only) <= _NAMES_FILTERED
            else None
        )
        self.namespaces = sorted({namespace for namespace, _ in only or ()})
        self.found: dict[tuple[str, str], _Usage] = {}
        self.histograms = Histograms()

    def usage(self, namespace: str, workload: str) -> _Usage | None:
        """The workload's merged usage; None when it is not one of those listed."""
        key = (namespace, workload)
        found = self.found.get(key)
        if found is None:
            if self.only is not None and key not in self.only:
                return None
            found = self.found[key] = _Usage(namespace, workload, len(self.found))
        return found

    def results(self) -> list[tuple[_Usage, WorkloadUsage | str]]:
        """Each workload with what it needs, or why not: the most GPU-hours first, then by
        namespace and workload."""
        count = len(self.found)
        sm = self.histograms.quantiles(count, "sm", 0.95).tolist()
        median = self.histograms.quantiles(count, "sm_mean", 0.5).tolist()
        dram = self.histograms.quantiles(count, "dram", 0.95).tolist()
        ordered = sorted(self.found.items(), key=lambda item: (-item[1].covered, item[0]))
        return [
            (usage, _usage(usage, sm[usage.row], median[usage.row], dram[usage.row]))
            for _, usage in ordered
        ]

    def _where(self, table: Table, column: str, low: datetime, high: datetime) -> list[Any]:
        if self.names is None:
            return [table.c[column] >= low, table.c[column] < high]
        where = [table.c.workload.in_(self.names)]
        if table.primary_key.columns.keys()[:3] == [column, "namespace", "workload"]:
            step = timedelta(seconds=DAY_SECONDS if column == "day" else HOUR_SECONDS)
            buckets = [low]  # low is a bucket's start; high may be inside one (an estimate)
            while buckets[-1] + step < high and len(buckets) <= _BUCKETS_LISTED:
                buckets.append(buckets[-1] + step)
            if len(buckets) <= _BUCKETS_LISTED:
                # Each bucket, namespace and name looked up in the key: a range of buckets
                # reads every workload's rows in it (166 ms for 23 hours of the 8,000-GPU
                # benchmark store, against 0.8 ms for 10 workloads' buckets).
                in_key = [table.c[column].in_(buckets), table.c.namespace.in_(self.namespaces)]
                return [*where, *in_key]
        return [*where, table.c[column] >= low, table.c[column] < high]

    def rollups(
        self, summary: Table, histogram: Table, packed: Table, part: Span, share: float = 1.0
    ) -> None:
        """The whole buckets of ``part`` (``share``: the part of them to count): their packed
        histograms and the row-form ones not packed yet (recent, or written late)."""
        column = "day" if "day" in summary.c else "hour"
        low, high = _first_bucket(part), part.end
        s, h = summary.c, histogram.c
        # The summaries' rows as they are: summed here, and their peaks kept per bucket, in one
        # read (grouped in SQL it took two passes over the range's index).
        rows = self.connection.execute(
            select(
                s.namespace,
                s.workload,
                s[column].label("bucket"),
                s.gpu_model,
                s.mig_profile,
                s.covered_seconds,
                s.idle_gpu_seconds,
                s.period_covered_seconds,
                s.fb_used_max_mib,
                s.first_start,
                s.last_end,
                s.util_max,
            ).where(*self._where(summary, column, low, high)),
            execution_options=STREAMED,
        )
        peaks: dict[tuple[str, str, datetime], float] = {}
        for row in rows:
            if usage := self.usage(row.namespace, row.workload):
                usage.add(row, share)
                if row.util_max is not None:
                    key = (row.namespace, row.workload, row.bucket)
                    peaks[key] = max(peaks.get(key, -math.inf), float(row.util_max))
        for (namespace, workload, moment), peak in peaks.items():
            found = self.usage(namespace, workload)
            assert found is not None
            found.peaks.append((moment, peak))
        bins = self.connection.execute(
            select(h.namespace, h.workload, h.metric, h.percent, func.sum(h.seconds))
            .where(*self._where(histogram, column, low, high))
            .group_by(h.namespace, h.workload, h.metric, h.percent),
            execution_options=STREAMED,
        )
        histograms = self.histograms
        for namespace, workload, metric, percent, seconds in bins:
            if usage := self.usage(namespace, workload):
                histograms.bin(usage.row, metric, percent, float(seconds) * share)
        p = packed.c
        blobs = self.connection.execute(
            select(p.namespace, p.workload, p.histograms).where(
                *self._where(packed, column, low, high)
            ),
            execution_options=STREAMED_PACKED,
        )
        for chunk in blobs.partitions():
            listed = (
                (owner.row, blob)
                for ns, workload, blob in chunk
                if (owner := self.usage(ns, workload))
            )
            histograms.packed(listed, share)

    def raw(self, part: Span, reach: float) -> None:
        """The raw rows' time inside ``part``: rows up to ``reach`` seconds after its end may
        cover some of it."""
        c = gpu_window.c
        columns = [
            c.at,
            c.covers_seconds,
            c.node,
            c.gpu,
            c.uuid,
            c.gpu_i_id,
            c.namespace,
            c.pod,
            c.owner_name,
            c.job_type,
            c.period_seconds,
            c.util_max,
            c.util_idle_fraction,
            c.fb_used_max_mib,
            c.gpu_model,
            c.mig_profile,
            *(c[column] for column in METRICS.values()),
        ]
        query = select(*columns).where(
            c.at >= part.start,
            c.at <= part.end + timedelta(seconds=reach),
            c.pod.is_not(None),
        )
        if self.node is not None:
            query = query.where(c.node == self.node)
        if self.names is not None:
            query = query.where(or_(c.owner_name.in_(self.names), c.pod.in_(self.names)))
        for row in self.connection.execute(query, execution_options=STREAMED).mappings():
            seconds = overlap_seconds(row, part.start, part.end)
            if seconds is None:
                continue
            usage = self.usage(row["namespace"] or "", workload_of(row))
            if usage is None:
                continue
            end = min(row["at"], part.end)
            start = max(row["at"] - timedelta(seconds=row["covers_seconds"]), part.start)
            summary, histogram = contributions(row, min(start, end), end, seconds)
            usage.add(_Row(summary))
            if row["util_max"] is not None:
                usage.peaks.append((row["at"], float(row["util_max"])))
            for entry in histogram:
                self.histograms.bin(usage.row, entry["metric"], entry["percent"], entry["seconds"])


class _Row:
    """A raw part's summary read as a rollup row is."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def _first_bucket(span: Span) -> datetime:
    """The first rollup bucket of a part: an estimate's is the hour it lies in."""
    return bucket_start(span.start, HOUR_SECONDS) if span.source == "estimate" else span.start


@dataclass(frozen=True)
class _Part:
    """A part of the range to merge: its span, and for raw rows how long after its end a row may
    cover some of it; for an estimate, the share of its hour inside the range."""

    span: Span
    reach: float = 0.0
    share: float = 1.0

    def tables(self) -> tuple[Table, Table, Table]:
        """Its rollups: the summaries, the histograms and the packed histograms."""
        if self.span.source == "day":
            return rightsize_day, activity_day, activity_day_packed
        return rightsize_hour, activity_hour, activity_hour_packed


def _parts(
    connection: Connection,
    since: datetime,
    until: datetime,
    node: str | None,
    notes: list[str] | None,
) -> list[_Part]:
    """``[since, until)`` as the parts to merge; ``notes`` gets what they leave out."""
    horizon = connection.execute(
        select(store_horizon.c.removed_before).where(store_horizon.c.table_name == "gpu_window")
    ).scalar()

    def reach(moment: datetime) -> float:
        """How long after ``moment`` a row may cover time before it (``history.py``)."""
        return longest_covers(connection, moment - _ONE_MICROSECOND, node)

    if node is not None:  # the rollups do not know nodes: the node's raw rows
        start = since if horizon is None else max(since, horizon)
        if start > since and notes is not None:
            notes.append(
                f"raw rows before {start.isoformat()} were removed by retention: --node"
                " advises from the time after it"
            )
        return [_Part(Span(start, until, "raw"), reach(until))] if start < until else []
    parts = []
    for span in spans(since, until, horizon=horizon):
        if span.source == "raw":
            parts.append(_Part(span, reach=reach(span.end)))
        elif span.source == "estimate":
            share = (span.end - span.start).total_seconds() / HOUR_SECONDS
            parts.append(_Part(span, share=share))
        else:
            parts.append(_Part(span))
    return parts


def _seconds_by_workload(dialect: str, part: _Part, node: str | None) -> Select[Any]:
    """Each workload's covered seconds inside ``part`` (one row per raw row or rollup row)."""
    if part.span.source == "raw":
        c = gpu_window.c
        covered, conditions = raw_time_inside(
            dialect, part.span.start, part.span.end, node, reach_after=part.reach
        )
        return select(
            func.coalesce(c.namespace, literal("")).label("namespace"),
            func.coalesce(func.nullif(c.owner_name, ""), c.pod).label("workload"),
            covered.label("seconds"),
        ).where(*conditions, c.pod.is_not(None))
    summary = part.tables()[0]
    column = summary.c["day" if "day" in summary.c else "hour"]
    low = _first_bucket(part.span)
    return select(
        summary.c.namespace,
        summary.c.workload,
        (summary.c.covered_seconds * part.share).label("seconds"),
    ).where(column >= low, column < part.span.end)


def _largest_workloads(
    connection: Connection,
    parts: list[_Part],
    node: str | None,
    top: int,
    notes: list[str] | None,
) -> set[tuple[str, str]]:
    """The ``top`` workloads with the most GPU-hours over ``parts`` (ties by name), summed in
    SQL without their histograms; ``notes`` gets how many it leaves out."""
    dialect = connection.dialect.name
    every = union_all(*(_seconds_by_workload(dialect, part, node) for part in parts))
    u = every.subquery("seconds").c
    total = func.sum(u.seconds)
    # ORDER BY ... LIMIT keeps the top N as it reads the groups, where ranking them all with
    # row_number() sorted every workload of the range (0.45 s of 2 s at 199,000).
    rows = connection.execute(
        select(u.namespace, u.workload, func.count().over().label("workloads"))
        .group_by(u.namespace, u.workload)
        .order_by(total.desc(), u.namespace, u.workload)
        .limit(top)
    ).all()
    workloads = int(rows[0].workloads) if rows else 0
    if notes is not None and workloads > top:
        notes.append(
            f"rightsize advises the {top} workloads with the most GPU-hours; --top 0 also "
            f"advises {workloads - top}"
        )
    return {(row.namespace, row.workload) for row in rows}


def workload_usages(
    connection: Connection,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
    top: int | None = None,
    notes: list[str] | None = None,
) -> list[tuple[_Usage, WorkloadUsage | str]]:
    """Each workload of ``[since, until)`` with what it needs, or why it cannot be advised, the
    most GPU-hours first (the ``top`` of them: ranked first, then only theirs merged);
    ``notes`` gets what the advice leaves out."""
    parts = _parts(connection, since, until, node, notes)
    if not parts:
        return []
    only = _largest_workloads(connection, parts, node, top, notes) if top else None
    if only is not None and not only:
        return []
    merge = _Merge(connection, node, only)
    for part in parts:
        if part.span.source == "raw":
            merge.raw(part.span, part.reach)
        else:
            merge.rollups(*part.tables(), part.span, part.share)
    return merge.results()


def rightsize_advice(
    connection: Connection,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
    headroom: float | None = None,
    top: int | None = None,
    notes: list[str] | None = None,
) -> list[Advice]:
    """One advice per workload seen on a GPU in ``[since, until)``, the most GPU-hours first
    (the ``top`` of them); ``notes`` gets what it leaves out."""
    advices = []
    usages = workload_usages(connection, since=since, until=until, node=node, top=top, notes=notes)
    for merged, usage in usages:
        if isinstance(usage, str):
            advices.append(_without_advice(merged, usage))
            continue
        model = model_for(usage.gpu_model) if usage.gpu_model else None
        if model is not None and usage.current_profile and not model.profile(usage.current_profile):
            reason = f"profile {usage.current_profile} is not in the {model.key} table"
            advices.append(_without_advice(merged, reason))
            continue
        extra = {} if headroom is None else {"headroom": headroom}
        advices.append(recommend(usage, model, **extra))
    return advices
