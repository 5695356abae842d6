"""The waste view: idle GPU-hours split by who could act on them (``WASTE_KINDS``), each by
namespace and workload, with the GPUs that added idle time to each.

A row's idle time is its covered time times its idle fraction; it is memory held when the
window's peak framebuffer reached ``HELD_MEMORY_MIB``, else allocated when a pod held the GPU,
else unclaimed. Aggregation runs in the database, over the relation of ``gpu_history``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    CompoundSelect,
    Connection,
    Select,
    case,
    cast,
    func,
    literal,
    null,
    select,
    union_all,
)

# Idle GPU-hours by who can act on them: nobody claimed the GPU (no pod: the scheduler or the
# autoscaler); a pod holds memory on it but computes nothing (a notebook, a server with no
# traffic, a hung job); a pod holds it with nothing on it at all.
WASTE_KINDS = ("idle-no-pod", "memory-held-compute-idle", "allocated-idle")
_SECONDS_PER_HOUR = 3600.0
# Above this many chosen workloads, waste counts every group's GPUs rather than bind as many
# names (each a parameter of the query) to filter the rows.
_OWNERS_FILTERED = 1000


@dataclass
class WasteSummary:
    """Idle GPU-hours of one kind (``WASTE_KINDS``) in one namespace and workload."""

    kind: str
    namespace: str | None
    owner_kind: str | None
    owner_name: str | None
    gpus: int  # distinct GPUs that contributed
    idle_gpu_hours: float


def waste_summaries(
    connection: Connection,
    history: Any,
    top: int | None = None,
    notes: list[str] | None = None,
    *,
    whole_days: bool = True,
    ranking: Any = None,
    unowned: Any = None,
) -> list[WasteSummary]:
    """Idle GPU-hours of ``history`` split by ``WASTE_KINDS``, each by namespace and workload,
    most first (the ``top`` of each kind); ``gpus`` counts the GPUs that added idle time to the
    group. ``notes`` gets how many groups ``top`` left out.

    Counting GPUs forms one group per GPU and workload. Over hours (``whole_days`` False: the
    relation reads no daily rollup) that is cheap, and one query ranks and counts. Over days
    it is most of the cost (936,500 groups in a month of the 8,000-GPU benchmark store), so
    the groups are ranked without counting GPUs, then GPUs are counted for the chosen groups
    only, whose rows the rollups' index on the workload's name finds (revision 0014).
    ``ranking``: the relation to rank from, with the workload keys and idle seconds of
    ``history`` (``History.idle``: whole days from the idle blocks); None: ``history``.
    ``unowned``: where to count the GPUs of the chosen workloads without an owner name
    (``History.unowned``: whole days from the idle blocks' GPUs); None: ``history``.
    """
    keys = _keys(history)
    if top and not whole_days:
        with _grouping_by_hashing(connection):
            ranked = _top_of_each_kind(connection, _per_group(history, keys).cte("grouped"), top)
        _note_left_out(ranked, top, notes)
        return _summaries(tuple(row[:6]) for row in ranked)
    chosen: set[tuple[Any, ...]] | None = None
    owners: list[str] | None = None
    if top:
        chosen = _largest_waste(connection, ranking if ranking is not None else history, top, notes)
        if not chosen:
            return []
        names = sorted({key[3] for key in chosen})
        # A superset of the chosen groups' rows, filtered inside each part of the relation.
        owners = names if len(names) <= _OWNERS_FILTERED else None
    rows = connection.execute(_counted(history, keys, owners, unowned)).all()
    return _summaries(tuple(row) for row in rows if chosen is None or tuple(row[:4]) in chosen)


def _keys(history: Any) -> tuple[Any, ...]:
    """A waste group's keys: the kind as its index in WASTE_KINDS (a small integer hashes
    faster than its name, and every row of the range is hashed), namespace and workload."""
    h = history.c
    kind = case((h.memory_held, literal(1)), (h.has_pod, literal(2)), else_=literal(0))
    return (kind.label("kind"), h.namespace, h.owner_kind, h.owner_name)


def _per_group(history: Any, keys: tuple[Any, ...], owners: list[str] | None = None) -> Select[Any]:
    """Per group of ``keys``: the GPUs that added idle time and the idle seconds. Per GPU first,
    then per group: counting GPUs as groups, not count(DISTINCT ...), which sorts every row."""
    h = history.c
    per_gpu = select(*keys, func.sum(h.idle_gpu_seconds).label("idle_gpu_seconds")).where(
        h.idle_gpu_seconds > 0
    )
    if owners is not None:
        per_gpu = per_gpu.where(h.owner_name.in_(owners))
    g = per_gpu.group_by(*keys, h.node, h.uuid, h.gpu_i_id).subquery("per_gpu").c
    return select(
        g.kind,
        g.namespace,
        g.owner_kind,
        g.owner_name,
        func.count().label("gpus"),
        func.sum(g.idle_gpu_seconds).label("idle_gpu_seconds"),
    ).group_by(g.kind, g.namespace, g.owner_kind, g.owner_name)


def _counted(
    history: Any, keys: tuple[Any, ...], owners: list[str] | None, unowned: Any
) -> Select[Any] | CompoundSelect[Any]:
    """``_per_group`` of the ``owners`` named, those without a name ('') from ``unowned``
    where given. The index on the owner's name finds every row of those in ``history``'s days:
    all the GPUs without a pod, 199,000 rows of a month in the 8,500-GPU benchmark store."""
    if owners is None or unowned is None or "" not in owners:
        return _per_group(history, keys, owners)
    named = [name for name in owners if name]
    nameless = _per_group(unowned, _keys(unowned), [""])
    return union_all(_per_group(history, keys, named), nameless) if named else nameless


@contextmanager
def _grouping_by_hashing(connection: Connection) -> Iterator[None]:
    """On PostgreSQL, no sorts planned for the statements inside, so both groupings hash.

    Over a day of hours PostgreSQL 15 sorts the per-GPU groups (121,000 rows from its workers
    in the 8,000-GPU benchmark store) to hand them in order to the grouping per workload: it
    underestimates the groups by half, and within 1 % of cost it keeps the sorted plan.
    Hashing both: 0.46-0.50 s against 0.57-0.68 s (benchmarks/RESULTS.md). SET LOCAL
    lasts until the transaction ends, so it is put back at once; an error inside rolls it
    back with the transaction.
    """
    if connection.dialect.name != "postgresql":
        yield
        return
    connection.exec_driver_sql("SET LOCAL enable_sort = off")
    yield
    connection.exec_driver_sql("SET LOCAL enable_sort TO DEFAULT")


def _largest_waste(
    connection: Connection, history: Any, top: int, notes: list[str] | None
) -> set[tuple[Any, ...]]:
    """The keys of the ``top`` groups of each kind with the most idle seconds (ties by name)."""
    h = history.c
    keys = _keys(history)
    grouped = (
        select(*keys, func.sum(h.idle_gpu_seconds).label("idle_gpu_seconds"))
        .where(h.idle_gpu_seconds > 0)
        .group_by(*keys)
        .cte("grouped")
    )
    ranked = _top_of_each_kind(connection, grouped, top)
    _note_left_out(ranked, top, notes)
    return {tuple(row[:4]) for row in ranked}


def _top_of_each_kind(connection: Connection, grouped: CTE, top: int) -> list[Any]:
    """The ``top`` rows of ``grouped`` of each kind, most idle seconds first (ties by name),
    each with the number of groups of its kind (``groups``, the last column).

    Each kind's top by ORDER BY ... LIMIT over the groups, which keeps a heap of ``top`` rows;
    numbering every group per kind with row_number() sorted all of them by kind, idle time
    and names (1.3 s of 3.8 s over 204,000 groups). The groups per kind are counted by a
    grouping of their own, not a window, which sorted them all by kind (0.1 s of 1.4 s).
    """
    g = grouped.c
    largest = [
        select(*g, cast(null(), BigInteger).label("groups"))
        .where(g.kind == kind)
        .order_by(g.idle_gpu_seconds.desc(), g.namespace, g.owner_kind, g.owner_name)
        .limit(top)
        .subquery(f"kind_{kind}")
        for kind in range(len(WASTE_KINDS))
    ]
    # Typed NULLs: PostgreSQL reads an untyped one in a subquery as text.
    empty = [cast(null(), column.type).label(column.name) for column in list(g)[1:]]
    counts = select(g.kind, *empty, func.count().label("groups")).group_by(g.kind)
    rows = connection.execute(union_all(*(select(*part.c) for part in largest), counts)).all()
    groups = {int(row.kind): int(row.groups) for row in rows if row.groups is not None}
    return [(*row[:-1], groups[int(row.kind)]) for row in rows if row.groups is None]


def _note_left_out(ranked: list[Any], top: int, notes: list[str] | None) -> None:
    left_out = {int(row[0]): int(row[-1]) - top for row in ranked if row[-1] > top}
    if notes is not None and left_out:
        counts = ", ".join(
            f"{count} of {WASTE_KINDS[kind]}" for kind, count in sorted(left_out.items())
        )
        notes.append(f"waste lists the {top} largest of each kind; --top 0 also lists {counts}")


def _summaries(rows: Any) -> list[WasteSummary]:
    """Rows of (kind, namespace, owner kind, owner name, GPUs, idle seconds), most idle first
    within each kind, ties by name."""
    summaries = [
        WasteSummary(
            WASTE_KINDS[kind_index],
            namespace or None,  # the rollups' '' for "no pod"
            owner_kind or None,
            owner_name or None,
            gpus,
            float(seconds) / _SECONDS_PER_HOUR,
        )
        for kind_index, namespace, owner_kind, owner_name, gpus, seconds in rows
    ]
    # Ties by name, as the ranking breaks them: the rows come in whatever order the plan gives.
    return sorted(
        summaries,
        key=lambda w: (
            WASTE_KINDS.index(w.kind),
            -w.idle_gpu_hours,
            w.namespace or "",
            w.owner_kind or "",
            w.owner_name or "",
        ),
    )
