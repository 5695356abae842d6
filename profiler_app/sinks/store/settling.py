"""Settling: the last complete days of ``gpu_job_day`` made again from ``gpu_day`` where they
disagree.

Each cycle upserts ``gpu_job_day`` as it upserts ``gpu_day`` (rollups.py). A daemon older than
revision 0013 writes ``gpu_day`` only: while a rolling update replaces the DaemonSet's pods one
node at a time, for hours on a large cluster, the nodes not yet replaced (or removed before
their turn) would be missing from the node and GPU views' days. So every
``SETTLE_EVERY_SECONDS`` the writer compares, for each of the last ``SETTLE_DAYS`` complete UTC
days, the covered time of both tables, and replaces a day whose totals differ by ``gpu_day``'s
rows summed over their workloads, as the migration filled it. A day is whole there within that
interval of its end, whoever wrote it; a late write into it (a cycle written after an outage)
by an old daemon is settled again. The comparison reads the two days' rows of both tables once:
with a thousand daemons each running it every 15 minutes, about one a second, tens of ms each.

One transaction: ``DELETE`` a day, then ``INSERT ... SELECT`` it from ``gpu_day``. On
PostgreSQL (read committed) a cycle upserting one of those rows concurrently either committed
before the ``INSERT``'s snapshot (its ``gpu_day`` time is in the sums, and the ``DELETE`` waited
for its row) or waits for this transaction and adds its time to the settled row: nothing is
lost or counted twice. One daemon settles at a time on PostgreSQL (an advisory lock); SQLite has
one writer anyway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.partitions import PartitionKeeper
from profiler_app.sinks.store.rollups import (
    DAY_SECONDS,
    GPU_DAY,
    GPU_JOB_DAY,
    GPU_VALUES,
    bucket_start,
)
from profiler_app.sinks.store.statements import Merge

log = logging.getLogger(__name__)

SETTLE_DAYS = 2
SETTLE_EVERY_SECONDS = 900.0
SETTLING_LOCK_ID = 0x67707573746C  # any fixed number: one daemon settles at a time
_AGGREGATES = {Merge.ADD: "sum", Merge.LARGER: "max", Merge.SMALLER: "min"}
# Sums of the same seconds in another order differ by rounding only: far below this share.
_TOLERANCE = 1e-9


def settle_statements(database: Database) -> tuple[str, str, str]:
    """The days of ``[first, last)`` whose covered time differs between gpu_day and
    gpu_job_day; the DELETE of such days from gpu_job_day; the INSERT of them from gpu_day
    (``first`` and ``last``: the driver's named parameters)."""
    day, first, last = GPU_JOB_DAY.column, database.param("first"), database.param("last")
    keys = ", ".join((day, *GPU_JOB_DAY.key))
    values = ", ".join(f"{_AGGREGATES[how]}({column})" for column, how in GPU_VALUES.items())
    where = f"WHERE {day} >= {first} AND {day} < {last}"
    all_days, job_days = (
        _day_totals(table, day, where) for table in (GPU_DAY.table, GPU_JOB_DAY.table)
    )
    differing = (
        f"SELECT all_days.day FROM ({all_days}) AS all_days"  # noqa: S608 (constants)
        f" LEFT JOIN ({job_days}) AS job_days ON job_days.day = all_days.day"
        " WHERE job_days.day IS NULL"
        f" OR abs(all_days.seconds - job_days.seconds) > {_TOLERANCE} * (1 + all_days.seconds)"
    )
    delete = f"DELETE FROM {GPU_JOB_DAY.table} {where}"  # noqa: S608 (constants)
    insert = (
        f"INSERT INTO {GPU_JOB_DAY.table} ({keys}, {', '.join(GPU_VALUES)})"  # noqa: S608
        f" SELECT {keys}, {values} FROM {GPU_DAY.table} {where} GROUP BY {keys}"
    )
    return differing, delete, insert


def _day_totals(table: str, day: str, where: str) -> str:
    return (
        f"SELECT {day} AS day, sum(covered_seconds) AS seconds"  # noqa: S608 (constants)
        f" FROM {table} {where} GROUP BY {day}"
    )


class Settling:
    """Settles the last ``days`` complete days at most every ``every`` seconds; first due
    ``every`` after it is made (a daemon's start is busy enough)."""

    def __init__(
        self,
        *,
        days: int = SETTLE_DAYS,
        every: float = SETTLE_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.days = days
        self.every = every
        self._clock = clock
        self._next_at = clock() + every
        self._partitions = PartitionKeeper()

    def due(self) -> bool:
        return self._clock() >= self._next_at

    def settle(self, database: Database, now: datetime) -> int:
        """Replaces the complete days before ``now``'s day that disagree with gpu_day; the rows
        written, -1 when another daemon holds the lock. A failure is due again at once (the
        next cycle)."""
        last = bucket_start(now, DAY_SECONDS)
        first = last - timedelta(days=self.days)
        try:
            if database.backend == "postgresql":
                needs = [(GPU_JOB_DAY.table, first), (GPU_JOB_DAY.table, last - timedelta(days=1))]
                self._partitions.ensure(database, needs)
            with database.transaction() as cursor:
                written = _replace_days(database, cursor, {"first": first, "last": last})
        except database.errors:
            self._partitions.forget()  # retention may have dropped one under it
            raise
        self._next_at = self._clock() + self.every
        if written > 0:  # a day written by an older daemon, or a late write of one, repaired
            log.info("settling: rewrote %d gpu_job_day row(s) from gpu_day", written)
        return written


def _replace_days(database: Database, cursor: Any, bounds: dict[str, datetime]) -> int:
    if database.backend == "postgresql":
        cursor.execute(f"SELECT pg_try_advisory_xact_lock({SETTLING_LOCK_ID})")
        if not cursor.fetchone()[0]:
            return -1
    differing, delete, insert = settle_statements(database)
    cursor.execute(differing, database.bind(bounds))
    written = 0
    for (stored,) in cursor.fetchall():
        day = database.read_time(stored)
        one_day = database.bind({"first": day, "last": day + timedelta(days=1)})
        cursor.execute(delete, one_day)
        cursor.execute(insert, one_day)
        written += int(cursor.rowcount)
    return written
