"""The GPU time of a range as one relation, for the report: rollups for the whole days and hours
inside the range, raw rows only for the partial hours at its edges.

Every part has the rollups' shape (``GPU_COLUMNS``): a GPU, its job type, whether a pod held
it and the pod's workload, whether its memory was held, the covered and idle seconds inside the
part, and peaks. A raw row counts for the part of its covered time ``(at - covers_seconds, at]``
inside the range, in whole microseconds, as ``rollups.py`` splits it into buckets, so the parts
add up to what the raw rows alone give (``rollups=False``, the reference the tests hold the
rollups to). A row that covers nothing counts where its ``at`` is, in ``[since, until)``.

Where retention removed the raw rows of a partial edge hour (before ``store_horizon``), that
part is estimated from its hourly rollup, in proportion to the time of the hour inside the
range; ``History.notes`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Float,
    Select,
    Subquery,
    Table,
    and_,
    cast,
    false,
    func,
    literal,
    not_,
    null,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy import case as sql_case

from profiler_app.core.model import HELD_MEMORY_MIB
from profiler_app.sinks.store.idle_blocks import LEVELS, Taken, plan
from profiler_app.sinks.store.models import (
    gpu_day,
    gpu_hour,
    gpu_job_day,
    gpu_window,
    idle_block,
    idle_block_gpu,
    idle_block_made,
    store_horizon,
)
from profiler_app.sinks.store.rollups import (
    DAY_SECONDS,
    HOUR_SECONDS,
    MICROSECONDS,
    bucket_start,
    microseconds,
)

GPU_COLUMNS = (
    "node",
    "gpu",
    "uuid",
    "gpu_i_id",  # a MIG instance, '' for a whole GPU (revision 0009)
    "job_type",
    "memory_held",
    "namespace",
    "has_pod",
    "owner_kind",
    "owner_name",
    "covered_seconds",
    "idle_gpu_seconds",
    "util_max",
    "mem_copy_util_max",
    "fb_used_max_mib",
)
_KEY_COUNT = GPU_COLUMNS.index("covered_seconds")
_OWNER_KEYS = ("owner_kind", "owner_name")
_PEAKS = ("util_max", "mem_copy_util_max", "fb_used_max_mib")
_ONE_MICROSECOND = timedelta(microseconds=1)
# The keys gpu_job_day leaves out, as the relation holds them for a GPU without a pod.
_EMPTY_KEYS: dict[str, ColumnElement[Any]] = {
    "memory_held": false().label("memory_held"),
    "has_pod": false().label("has_pod"),
    **{key: literal("").label(key) for key in ("namespace", *_OWNER_KEYS)},
}

Source = Literal["raw", "hour", "day", "estimate"]


@dataclass(frozen=True)
class Span:
    """A part ``[start, end)`` of the range and where it is read from."""

    start: datetime
    end: datetime
    source: Source


def spans(since: datetime, until: datetime, *, horizon: datetime | None = None) -> list[Span]:
    """``[since, until)`` split into raw edges, whole hours and whole days, coarsest inside.

    A raw edge before ``horizon`` (retention removed its rows) is an estimate from its hour.
    """
    first_hour = _ceil(since, HOUR_SECONDS)
    last_hour = bucket_start(until, HOUR_SECONDS)
    if first_hour > last_hour:  # inside one hour
        parts = [Span(since, until, "raw")]
    else:  # each raw edge inside one hour
        parts = [Span(since, first_hour, "raw")]
        first_day, last_day = _ceil(first_hour, DAY_SECONDS), bucket_start(last_hour, DAY_SECONDS)
        if first_day < last_day:
            parts += [
                Span(first_hour, first_day, "hour"),
                Span(first_day, last_day, "day"),
                Span(last_day, last_hour, "hour"),
            ]
        else:
            parts.append(Span(first_hour, last_hour, "hour"))
        parts.append(Span(last_hour, until, "raw"))
    return [
        Span(part.start, part.end, "estimate")
        if part.source == "raw" and horizon is not None and part.start < horizon
        else part
        for part in parts
        if part.start < part.end
    ]


@dataclass
class History:
    """The relation of a range's GPU time (``relation``), what the report should say, and
    whether the relation reads whole days (a daily rollup). ``idle``: the same time where only
    the workload keys and idle seconds count, its whole days from the idle blocks made
    (``idle_blocks.py``; the GPU, job type, covered time and peaks NULL there); None where
    ``relation`` serves as well. ``unowned``: the same for the rows of workloads without an
    owner name, with their GPUs: its whole days from the blocks' ``idle_block_gpu`` (the rows of
    other workloads are left out there, so read it for owner name '' only)."""

    relation: Subquery
    notes: list[str] = field(default_factory=list)
    whole_days: bool = False
    idle: Subquery | None = None
    unowned: Subquery | None = None


def gpu_history(
    connection: Connection,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
    rollups: bool = True,
    workloads: bool = True,
) -> History:
    """The GPU time of ``[since, until)`` in the rollups' shape (``GPU_COLUMNS``); with
    ``rollups`` False, from the raw rows alone. With ``workloads`` False only the GPU and job
    type keys count: whole days come from ``gpu_job_day`` (one row per GPU and job type) and
    leave the other keys empty there."""
    dialect = connection.dialect.name
    if not rollups:
        return History(_raw(dialect, since, until, node).subquery("history"))
    horizon = connection.execute(
        select(store_horizon.c.removed_before).where(store_horizon.c.table_name == "gpu_window")
    ).scalar()
    parts: list[Select[Any]] = []
    blocks: tuple[int, list[Taken]] | None = None  # the whole days' part and its blocks' plan
    notes = []
    range_spans = spans(since, until, horizon=horizon)
    for part in range_spans:
        if part.source == "raw":
            before = longest_covers(connection, part.start - _ONE_MICROSECOND, node)
            after = longest_covers(connection, part.end - _ONE_MICROSECOND, node)
            parts.append(
                _raw(
                    dialect,
                    part.start,
                    part.end,
                    node,
                    reach_before=before,
                    reach_after=after,
                )
            )
        elif part.source == "estimate":
            parts.append(_estimate(part, node))
            notes.append(
                f"raw rows before {_iso(horizon)} were removed by retention: "
                f"{_iso(part.start)} to {_iso(part.end)} is estimated from its hourly rollup"
            )
        else:
            day = gpu_day if workloads else gpu_job_day
            parts.append(_tier(gpu_hour if part.source == "hour" else day, part, node))
            # Blocks hold no node: the ranking of one node reads its days from gpu_day.
            if workloads and part.source == "day" and node is None:
                taken = _blocks_taken(connection, part)
                blocks = (len(parts) - 1, taken) if taken is not None else None
    if not parts:  # an empty range: a part that finds nothing keeps the relation's shape
        parts.append(_raw(dialect, since, since, node, reach_after=0.0))
    whole_days = any(part.source == "day" for part in range_spans)
    history = History(union_all(*parts).subquery("history"), notes, whole_days)
    if blocks is not None:  # the same parts, the whole days' one from the blocks
        at, taken = blocks
        head, tail = parts[:at], parts[at + 1 :]
        history.idle, history.unowned = (
            union_all(*head, *_block_parts(taken, table), *tail).subquery("history")
            for table in (idle_block, idle_block_gpu)
        )
    return history


def epoch_microseconds(dialect: str, column: ColumnElement[Any]) -> ColumnElement[int]:
    """A stored time as whole microseconds since the epoch, exactly (as ``rollups.py``)."""
    value: ColumnElement[Any]
    if dialect == "postgresql":
        value = func.round(func.date_part("epoch", column) * MICROSECONDS)
    else:  # SQLite's text 'YYYY-MM-DD HH:MM:SS.ffffff': whole seconds, then the microseconds.
        # The seconds come from the text without its fraction: strftime('%s') reads milliseconds
        # and rounds, so '…:19.999999' would give :20, then 999,999 more microseconds.
        seconds = func.strftime("%s", func.substr(column, 1, 19))
        value = cast(seconds, BigInteger) * MICROSECONDS + cast(
            func.substr(column, 21, 6), BigInteger
        )
    return cast(value, BigInteger)


def larger(dialect: str, a: ColumnElement[Any], b: ColumnElement[Any]) -> ColumnElement[Any]:
    return func.greatest(a, b) if dialect == "postgresql" else func.max(a, b)


def smaller(dialect: str, a: ColumnElement[Any], b: ColumnElement[Any]) -> ColumnElement[Any]:
    return func.least(a, b) if dialect == "postgresql" else func.min(a, b)


def _covers_microseconds() -> ColumnElement[int]:
    return cast(func.round(gpu_window.c.covers_seconds * MICROSECONDS), BigInteger)


def raw_time_inside(
    dialect: str,
    start: datetime,
    end: datetime,
    node: str | None = None,
    *,
    reach_after: float | None = None,
) -> tuple[ColumnElement[Any], list[ColumnElement[bool]]]:
    """A raw row's covered seconds inside ``[start, end)``, exactly (in whole microseconds, as
    ``rollups.py`` splits it), and the conditions that pick the rows with time in it, or that
    cover nothing and are stamped in it. ``reach_after``: the longest any row covers of those
    reaching back over ``end`` (None: not known; every later row is looked at)."""
    c = gpu_window.c
    end_us = epoch_microseconds(dialect, c.at)
    covers_us = _covers_microseconds()
    start_value, end_value = literal(microseconds(start)), literal(microseconds(end))
    overlap_us = smaller(dialect, end_us, end_value) - larger(
        dialect, end_us - covers_us, start_value
    )
    exact = cast(overlap_us, Float) / float(MICROSECONDS)
    # Covers at least one microsecond, as rounded (a row covering nothing sits at its time).
    positive = c.covers_seconds >= 0.5 / MICROSECONDS
    conditions = [
        c.at >= start,
        or_(
            and_(positive, c.at > start, or_(c.at <= end, overlap_us > 0)),
            and_(not_(positive), c.at < end),
        ),
    ]
    if reach_after is not None:
        conditions.append(c.at < end + timedelta(seconds=reach_after) + _ONE_MICROSECOND)
    if node is not None:
        conditions.append(c.node == node)
    return exact, conditions


def _raw(
    dialect: str,
    start: datetime,
    end: datetime,
    node: str | None,
    *,
    reach_before: float | None = None,
    reach_after: float | None = None,
) -> Select[Any]:
    """The raw rows' time inside ``[start, end)``. ``reach_before`` and ``reach_after``: the
    longest any row covers of those reaching back over ``start`` and over ``end`` (None: not
    known; every row is computed exactly and every later row looked at). A row wholly inside
    counts its ``covers_seconds`` as it is; only the few that straddle an edge are computed
    in microseconds."""
    c = gpu_window.c
    exact, conditions = raw_time_inside(dialect, start, end, node, reach_after=reach_after)
    covered: ColumnElement[Any] = exact
    if reach_before is not None:
        inside = start + timedelta(seconds=reach_before) + _ONE_MICROSECOND
        # As rounded, like the rollups.
        whole = cast(_covers_microseconds(), Float) / float(MICROSECONDS)
        covered = sql_case((and_(c.at >= inside, c.at <= end), whole), else_=exact)
    return select(
        c.node,
        c.gpu,
        c.uuid,
        c.gpu_i_id,
        c.job_type,
        sql_case((c.fb_used_max_mib >= HELD_MEMORY_MIB, true()), else_=false()).label(
            "memory_held"
        ),
        func.coalesce(c.namespace, literal("")).label("namespace"),
        sql_case((c.pod.is_not(None), true()), else_=false()).label("has_pod"),
        *(func.coalesce(c[key], literal("")).label(key) for key in _OWNER_KEYS),
        covered.label("covered_seconds"),
        (covered * func.coalesce(c.util_idle_fraction, 0.0)).label("idle_gpu_seconds"),
        *(c[peak] for peak in _PEAKS),
    ).where(*conditions)


def _keys(table: Table) -> list[ColumnElement[Any]]:
    """A rollup's key columns in the relation's shape (gpu_hour names the pod; gpu_job_day
    leaves out all but the GPU and job type)."""
    return [
        (table.c.pod != "").label("has_pod") if column == "has_pod" and table is gpu_hour
        else table.c[column] if column in table.c
        else _EMPTY_KEYS[column]
        for column in GPU_COLUMNS[:_KEY_COUNT]
    ]  # fmt: skip


def _tier(table: Table, part: Span, node: str | None) -> Select[Any]:
    """Whole buckets of a rollup, as they are."""
    bucket = table.c.hour if table is gpu_hour else table.c.day
    values = (table.c[column] for column in GPU_COLUMNS[_KEY_COUNT:])
    query = select(*_keys(table), *values).where(bucket >= part.start, bucket < part.end)
    return query.where(table.c.node == node) if node is not None else query


def _blocks_taken(connection: Connection, part: Span) -> list[Taken] | None:
    """The plan of whole days as the idle blocks made inside them (those not older than
    gpu_day's oldest day, which retention may have dropped under them) and the days between;
    None where no block is made inside them."""
    if part.end - part.start < timedelta(days=LEVELS[0]):
        return None
    b = idle_block_made.c
    oldest = select(func.min(gpu_day.c.day)).scalar_subquery()
    query = select(b.start, b.days).where(
        b.start >= part.start, b.start < part.end, b.start >= oldest
    )
    made = {(start, int(days)) for start, days in connection.execute(query)}
    taken = plan(part.start, part.end, made)
    return None if all(days is None for _, _, days in taken) else taken


def _block_parts(taken: list[Taken], table: Table) -> list[Select[Any]]:
    """The planned whole days from ``table``'s blocks (``idle_block`` or ``idle_block_gpu``),
    the days between from gpu_day."""
    return [
        _tier(gpu_day, Span(start, end, "day"), None) if days is None
        else select(*_block_columns(table)).where(table.c.start == start, table.c.days == days)
        for start, end, days in taken
    ]  # fmt: skip


def _block_columns(table: Table) -> list[ColumnElement[Any]]:
    """A block table's rows in the relation's shape: what it does not hold NULL, but the owner
    name of ``idle_block_gpu``, which is '' for all its rows."""
    c = table.c
    return [
        c[column] if column in c
        else literal("").label(column) if column == "owner_name"
        else cast(null(), gpu_day.c[column].type).label(column)
        for column in GPU_COLUMNS
    ]  # fmt: skip


def _estimate(part: Span, node: str | None) -> Select[Any]:
    """A partial hour whose raw rows are gone: its hourly rollup, in proportion."""
    share = (part.end - part.start).total_seconds() / HOUR_SECONDS
    c = gpu_hour.c
    query = select(
        *_keys(gpu_hour),
        (c.covered_seconds * share).label("covered_seconds"),
        (c.idle_gpu_seconds * share).label("idle_gpu_seconds"),
        *(c[peak] for peak in _PEAKS),
    ).where(c.hour == bucket_start(part.start, HOUR_SECONDS))
    return query.where(c.node == node) if node is not None else query


def longest_covers(connection: Connection, moment: datetime, node: str | None) -> float:
    """The longest ``covers_seconds`` of the rows covering time in the hour of ``moment``:
    a row reaching back over ``moment`` is at most that much later than it."""
    query = select(func.max(gpu_hour.c.covers_max_seconds)).where(
        gpu_hour.c.hour == bucket_start(moment, HOUR_SECONDS)
    )
    if node is not None:
        query = query.where(gpu_hour.c.node == node)
    return float(connection.execute(query).scalar() or 0.0)


def _ceil(moment: datetime, seconds: int) -> datetime:
    start = bucket_start(moment, seconds)
    return start if start == moment else start + timedelta(seconds=seconds)


def _iso(moment: datetime | None) -> str:
    assert moment is not None
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
