"""Idle blocks: each workload's idle time summed over blocks of whole days, for the ranking of
``report --by waste`` (revision 0015).

Why: a month of ``gpu_day`` holds a row per GPU, job type, workload and day. Workloads run a
few days each, so longer buckets of fixed length merge few of their rows; blocks of several
lengths do: a range of whole days is covered by the largest blocks inside it, the days left
over read from ``gpu_day`` (``plan``). Lengths are powers of two (``LEVELS``), aligned on the
epoch, so each block is two of the level below.

A block is made once its last day ended ``MARGIN_DAYS`` ago, from ``gpu_day`` for two days and
from its two halves above: one transaction inserts its rows, the idle time per GPU of its
workloads without an owner name (``idle_block_gpu``, revision 0016: waste counts their GPUs
there) and its row in ``idle_block_made``, which the report reads to know what is there (an
empty block is made, not missing). A cycle whose rows reach back past yesterday (a window
longer than a day, or a cycle written late after the store was down for days) drops the blocks
holding the days it writes, in its own transaction (``forget``); they are made again from
``gpu_day`` by a later call. On PostgreSQL that waits for the advisory lock, so a block being
made while a late cycle writes is either made before the cycle drops it or made after it from
the cycle's rows. Every ``MAKE_EVERY_SECONDS`` the writer makes at most ``MAX_BLOCKS``,
smallest first, so a store migrated with months of days fills over a few hours, the report
reading ``gpu_day`` for the blocks not made yet. Blocks older than ``gpu_day``'s oldest day
(retention dropped days under them) go in the same call. One daemon makes blocks at a time on
PostgreSQL (an advisory lock); SQLite has one writer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from datetime import datetime, timedelta
from typing import Any

from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.rollups import DAY_SECONDS, EPOCH, bucket_start

log = logging.getLogger(__name__)

LEVELS = (2, 4, 8, 16)  # days per block
MARGIN_DAYS = 2  # a block is made once its last day ended this long ago
MAKE_EVERY_SECONDS = 900.0
MAX_BLOCKS = 8  # per call; a block took 0.7 s on average at 8,500 GPUs
IDLE_BLOCK_LOCK_ID = 0x677075626C6B  # any fixed number: one daemon makes blocks at a time
# What a block sums over: the workload, and what makes the kind of waste. Not the node: the
# ranking is the cluster's, and a workload on many nodes would be as many rows.
KEY = ("memory_held", "has_pod", "namespace", "owner_kind", "owner_name")
# The GPUs of the workloads without an owner name ('' there): no pod, or a pod without a
# controller. The owner's name is not in the key: it is '' for all of them.
GPU_KEY = ("memory_held", "has_pod", "namespace", "owner_kind", "node", "uuid", "gpu_i_id")
_TABLES = ("idle_block_made", "idle_block", "idle_block_gpu")
# Each table of a block's rows, its key and which of gpu_day's idle rows a 2-day block sums.
_MADE_FROM_GPU_DAY = (("idle_block", KEY, ""), ("idle_block_gpu", GPU_KEY, " AND owner_name = ''"))
_ONE_DAY = timedelta(days=1)

Block = tuple[datetime, int]  # (start, days)
Taken = tuple[datetime, datetime, int | None]  # (start, end, days): a block, or None: gpu_day


def plan(first: datetime, last: datetime, made: Collection[Block]) -> list[Taken]:
    """The whole days ``[first, last)`` as the largest ``made`` blocks inside them, each
    ``(start, end, days)``, and the runs of days between them ``(start, end, None)``."""
    parts: list[Taken] = []
    day = first
    while day < last:
        days = next(
            (
                days
                for days in reversed(LEVELS)
                if (day, days) in made and day + timedelta(days=days) <= last
            ),
            None,
        )
        end = day + timedelta(days=days or 1)
        if days is None and parts and parts[-1][2] is None:
            parts[-1] = (parts[-1][0], end, None)
        else:
            parts.append((day, end, days))
        day = end
    return parts


def late_days(
    earliest: datetime, latest: datetime, now: datetime
) -> tuple[datetime, datetime] | None:
    """The days ``[first, end)`` that a write of the time from ``earliest`` to ``latest``
    changes and that blocks made at ``now`` may hold, with a day to spare for other daemons'
    clocks; None if there are none."""
    first = bucket_start(earliest, DAY_SECONDS)
    end = min(
        bucket_start(latest, DAY_SECONDS) + _ONE_DAY,
        bucket_start(now, DAY_SECONDS) - timedelta(days=MARGIN_DAYS - 1),
    )
    return (first, end) if first < end else None


def blocks_over(first: datetime, end: datetime) -> Iterator[Block]:
    """Every block of every level holding a day of ``[first, end)``."""
    low, high = _epoch_day(bucket_start(first, DAY_SECONDS)), _epoch_day(end)
    for days in LEVELS:
        for index in range(low // days * days, high, days):
            yield EPOCH + timedelta(days=index), days


def forget(database: Database, cursor: Any, first: datetime, end: datetime) -> int:
    """Drops, in the caller's transaction, the blocks holding a day of ``[first, end)``: the
    blocks dropped (made again by a later ``IdleBlocks.make``)."""
    if database.backend == "postgresql":
        cursor.execute(f"SELECT pg_advisory_xact_lock({IDLE_BLOCK_LOCK_ID})")
    where = f"WHERE start = {database.param('start')} AND days = {database.param('days')}"
    dropped = 0
    for start, days in blocks_over(first, end):
        block = database.bind({"start": start, "days": days})
        for table in _TABLES:
            cursor.execute(f"DELETE FROM {table} {where}", block)  # noqa: S608
            if table == "idle_block_made":
                dropped += max(int(cursor.rowcount), 0)
    return dropped


def due(oldest_day: datetime, now: datetime, made: Collection[Block]) -> Iterator[Block]:
    """The blocks to make, smallest first: inside ``[oldest_day, MARGIN_DAYS`` before ``now``'s
    day), not made, and for two days and more, both halves made (or due before them)."""
    end = bucket_start(now, DAY_SECONDS) - timedelta(days=MARGIN_DAYS)
    first = _epoch_day(bucket_start(oldest_day, DAY_SECONDS))
    if bucket_start(oldest_day, DAY_SECONDS) < oldest_day:
        first += 1
    have = set(made)
    for days in LEVELS:
        index = -(-first // days) * days
        while (start := EPOCH + timedelta(days=index)) + timedelta(days=days) <= end:
            half = timedelta(days=days // 2)
            halves = days == LEVELS[0] or {(start, days // 2), (start + half, days // 2)} <= have
            if (start, days) not in have and halves:
                have.add((start, days))
                yield start, days
            index += days


class IdleBlocks:
    """Makes the due blocks at most every ``every`` seconds, at most ``limit`` per call; first
    due ``every`` after it is made (a daemon's start is busy enough)."""

    def __init__(
        self,
        *,
        every: float = MAKE_EVERY_SECONDS,
        limit: int = MAX_BLOCKS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        self.limit = limit
        self._clock = clock
        self._next_at = clock() + every

    def due(self) -> bool:
        return self._clock() >= self._next_at

    def make(self, database: Database, now: datetime) -> int:
        """Drops the blocks older than gpu_day's oldest day and makes the due ones: the blocks
        made, -1 when another daemon holds the lock. A failure is due again at once."""
        with database.transaction() as cursor:
            made = _make(database, cursor, now, self.limit)
        self._next_at = self._clock() + self.every
        if made > 0:
            log.info("idle blocks: made %d block(s) of whole days from gpu_day", made)
        return made


def _make(database: Database, cursor: Any, now: datetime, limit: int) -> int:
    if database.backend == "postgresql":
        cursor.execute(f"SELECT pg_try_advisory_xact_lock({IDLE_BLOCK_LOCK_ID})")
        if not cursor.fetchone()[0]:
            return -1
    cursor.execute("SELECT min(day) FROM gpu_day")
    oldest = cursor.fetchone()[0]
    if oldest is None:
        return 0
    oldest_day = database.read_time(oldest)
    bound = database.bind({"oldest": oldest_day})
    start = database.param("oldest")
    for table in _TABLES:
        cursor.execute(f"DELETE FROM {table} WHERE start < {start}", bound)  # noqa: S608
    cursor.execute("SELECT start, days FROM idle_block_made")
    made = {(database.read_time(stored), int(days)) for stored, days in cursor.fetchall()}
    count = 0
    for block in due(oldest_day, now, made):
        if count == limit:
            break
        _make_block(database, cursor, block, now)
        count += 1
    return count


def _make_block(database: Database, cursor: Any, block: Block, now: datetime) -> None:
    start, days = block
    p = database.param
    values = database.bind(
        {"start": start, "end": start + timedelta(days=days), "days": days, "half": days // 2}
    )
    for table, key, only in _MADE_FROM_GPU_DAY:
        if days == LEVELS[0]:
            source = (
                f"gpu_day WHERE day >= {p('start')} AND day < {p('end')}"
                f" AND idle_gpu_seconds > 0{only}"
            )
        else:
            source = (
                f"{table} WHERE days = {p('half')} AND start >= {p('start')} AND start < {p('end')}"
            )
        keys = ", ".join(key)
        cursor.execute(
            f"INSERT INTO {table} (start, days, {keys}, idle_gpu_seconds)"  # noqa: S608
            f" SELECT {p('start')}, {p('days')}, {keys}, sum(idle_gpu_seconds) FROM {source}"
            f" GROUP BY {keys}",
            values,
        )
    cursor.execute(
        "INSERT INTO idle_block_made (start, days, made_at)"  # noqa: S608 (placeholders)
        f" VALUES ({p('start')}, {p('days')}, {p('now')})",
        database.bind({"start": start, "days": days, "now": now}),
    )


def _epoch_day(day: datetime) -> int:
    return (day - EPOCH) // _ONE_DAY
