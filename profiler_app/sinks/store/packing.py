"""Packing: the histograms of complete buckets, from ``activity_hour`` / ``activity_day``'s rows
(one per workload, metric and 1 % bucket) into ``activity_hour_packed`` /
``activity_day_packed`` (one per workload and bucket).

Why: a report over a month read one row per (workload, metric, bucket, day) and merged them one
by one in Python, O(buckets x workloads x days) in SQL and Python alike. A packed row holds a
workload's histograms of one hour or day, which the report decodes and sums with numpy.

A packed row's ``histograms`` is a sequence of ``RECORD_FIELDS`` records (little-endian uint16
cell, float64 seconds), one per histogram row it replaced, by cell: cell ``m * 101 + percent``
for the metric ``m`` of ``METRIC_ORDER``. Sparse, not a dense 3 x 101 array: a workload's
bucket uses a few tens of the 303 cells, and a dense 2,424-byte value would pass PostgreSQL's
TOAST threshold (2 kB) and be twice that size as bytea's hex text on the wire.

The writer packs, every ``PACK_EVERY_SECONDS``, the buckets that ended ``PACK_MARGIN_SECONDS``
ago: in one transaction per batch, ``DELETE ... RETURNING`` the oldest rows, then the packed rows
are inserted. On PostgreSQL a cycle upserting one of these rows concurrently either committed
it before (the DELETE returns the sum), still holds it (the batch skips it and a later call packs
it), or waits for the DELETE and inserts a fresh row after it: nothing is lost or counted twice,
and packing never waits for a cycle, so the two cannot deadlock. A late write for a packed
bucket makes row-form rows again, packed by a later call into a second packed row; readers sum
them all. One daemon packs at a time on PostgreSQL (an advisory lock); SQLite has one writer.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from profiler_app.sinks.store.activity import ACTIVITY_DAY, ACTIVITY_HOUR, BUCKETS, METRICS
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.partitions import SCHEMES, PartitionKeeper
from profiler_app.sinks.store.rollups import Tier, bucket_start

if TYPE_CHECKING:  # numpy is loaded where packing runs: report --help stays light
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger(__name__)

PACKED = {ACTIVITY_HOUR.table: "activity_hour_packed", ACTIVITY_DAY.table: "activity_day_packed"}
# For retention: the packed tables go with the other rollups.
PACKED_TIERS = tuple(
    Tier(PACKED[tier.table], tier.column, tier.seconds, ("namespace", "workload"))
    for tier in (ACTIVITY_HOUR, ACTIVITY_DAY)
)
METRIC_ORDER = tuple(METRICS)  # a packed cell's metric: cell // BUCKETS
CELLS = len(METRIC_ORDER) * BUCKETS
RECORD_FIELDS = [("cell", "<u2"), ("seconds", "<f8")]  # numpy's dtype of a packed record
# Late cycles: a bucket is packed once it ended this long ago (a later write is packed again).
PACK_MARGIN_SECONDS = 3600
PACK_EVERY_SECONDS = 900.0
BATCH_ROWS = 50_000
MAX_BATCHES = 20  # per call: a million rows at most; a backlog drains over several calls
PACKING_LOCK_ID = 0x67707570616B  # any fixed number: one daemon packs at a time
KEY = ("namespace", "workload", "metric", "percent")
# {table}, {column}: constants; {cutoff}, {rows}: the driver's placeholders; {skip}: on
# PostgreSQL, rows locked by a cycle are left for a later call (FOR UPDATE SKIP LOCKED). A DELETE
# alone waited for such a row while holding others, in the heap's order, that the cycle would
# upsert next: a deadlock. Packing now never waits for a row. The oldest rows in key order, so
# that a batch splits at most one workload's bucket in two packed rows.
PACK_BATCH = (
    "DELETE FROM {table} WHERE ({column}, namespace, workload, metric, percent) IN"
    " (SELECT {column}, namespace, workload, metric, percent FROM {table}"
    " WHERE {column} < {cutoff} ORDER BY {column}, namespace, workload LIMIT {rows}{skip})"
    " RETURNING {column}, namespace, workload, metric, percent, seconds"
)
SKIP_LOCKED = {"postgresql": " FOR UPDATE SKIP LOCKED", "sqlite": ""}  # SQLite: one writer
PACKED_INSERT = "INSERT INTO {table} ({column}, namespace, workload, histograms) VALUES ({values})"
_METRIC_INDEX = {metric: index for index, metric in enumerate(METRIC_ORDER)}


def cell(metric: str, percent: int) -> int | None:
    """A histogram row's cell in a packed row; None for a metric the report does not read."""
    index = _METRIC_INDEX.get(metric)
    if index is None:
        return None
    return index * BUCKETS + min(max(int(percent), 0), BUCKETS - 1)


def pack_rows(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, str, str, bytes]]:
    """Histogram rows ``(bucket, namespace, workload, metric, percent, seconds)`` as packed
    rows ``(bucket, namespace, workload, histograms)``, one per bucket and workload."""
    import numpy as np  # noqa: PLC0415 (see TYPE_CHECKING above)

    keys: dict[tuple[Any, str, str], int] = {}
    owners, cells, seconds = [], [], []
    for bucket, namespace, workload, metric, percent, value in rows:
        at = cell(metric, percent)
        if at is None:
            continue
        owners.append(keys.setdefault((bucket, namespace, workload), len(keys)))
        cells.append(at)
        seconds.append(float(value))
    records = np.empty(len(cells), RECORD_FIELDS)
    records["cell"] = cells
    records["seconds"] = seconds
    owner = np.asarray(owners, dtype=np.int64)
    order = np.lexsort((records["cell"], owner))
    records, owner = records[order], owner[order]
    bounds = np.searchsorted(owner, np.arange(len(keys) + 1))
    return [
        (*key, records[bounds[index] : bounds[index + 1]].tobytes()) for key, index in keys.items()
    ]


def unpack(blobs: Iterable[bytes]) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
    """The records of packed rows' ``histograms``, all in one array, and how many each row
    has (to repeat a per-row value over its records)."""
    import numpy as np  # noqa: PLC0415 (see TYPE_CHECKING above)

    record = np.dtype(RECORD_FIELDS)
    parts = [blob if isinstance(blob, bytes) else bytes(blob) for blob in blobs]
    counts = np.fromiter((len(part) // record.itemsize for part in parts), np.int64, len(parts))
    return counts, np.frombuffer(b"".join(parts), record)


class Packing:
    """Packs complete buckets at most every ``every`` seconds, in bounded batches; first due
    ``every`` after it is made (a daemon's start is busy enough)."""

    def __init__(
        self,
        *,
        batch_rows: int = BATCH_ROWS,
        max_batches: int = MAX_BATCHES,
        every: float = PACK_EVERY_SECONDS,
        margin_seconds: float = PACK_MARGIN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_rows = batch_rows
        self.max_batches = max_batches
        self.every = every
        self.margin = timedelta(seconds=margin_seconds)
        self._clock = clock
        self._next_at: float = clock() + every
        self._partitions = PartitionKeeper()

    def due(self) -> bool:
        return self._clock() >= self._next_at

    def pack(self, database: Database, now: datetime) -> int:
        """Packs the histogram rows of the buckets that ended ``margin`` before ``now``; the
        rows packed. When ``max_batches`` did not finish the job, the next call is due at once."""
        if database.backend == "sqlite" and sqlite3.sqlite_version_info < (3, 35, 0):
            log.warning("packing needs SQLite 3.35 (RETURNING); %s", sqlite3.sqlite_version)
            self._next_at = float("inf")
            return 0
        try:
            return self._pack(database, now)
        except database.errors:
            self._partitions.forget()  # retention may have dropped one under it
            raise

    def _pack(self, database: Database, now: datetime) -> int:
        packed, batches, finished = 0, 0, True
        for tier in (ACTIVITY_HOUR, ACTIVITY_DAY):
            cutoff = bucket_start(now - self.margin, tier.seconds)
            if database.backend == "postgresql":
                self._ensure_partitions(database, tier, cutoff)
            count = self.batch_rows
            while count == self.batch_rows:
                if batches == self.max_batches:
                    finished = False
                    break
                count = self._batch(database, tier, cutoff)
                if count < 0:  # another daemon is packing
                    break
                batches += count == self.batch_rows
                packed += count
        self._next_at = self._clock() + self.every if finished else 0.0
        if packed:
            log.info("packing: packed %d histogram row(s)", packed)
        return packed

    def _batch(self, database: Database, tier: Tier, cutoff: datetime) -> int:
        """One batch in one transaction: the rows deleted and packed, -1 when another daemon
        holds the packing lock."""
        param = database.param
        delete = PACK_BATCH.format(
            table=tier.table,
            column=tier.column,
            cutoff=param("cutoff"),
            rows=param("rows"),
            skip=SKIP_LOCKED[database.backend],
        )
        names = (tier.column, "namespace", "workload", "histograms")
        insert = PACKED_INSERT.format(
            table=PACKED[tier.table],
            column=tier.column,
            values=", ".join(param(name) for name in names),
        )
        with database.transaction() as cursor:
            if database.backend == "postgresql":
                cursor.execute(f"SELECT pg_try_advisory_xact_lock({PACKING_LOCK_ID})")
                if not cursor.fetchone()[0]:
                    return -1
            cursor.execute(delete, database.bind({"cutoff": cutoff, "rows": self.batch_rows}))
            rows = cursor.fetchall()
            packed = pack_rows(rows)
            if packed:
                cursor.executemany(insert, [dict(zip(names, row, strict=True)) for row in packed])
        return len(rows)

    def _ensure_partitions(self, database: Database, tier: Tier, cutoff: datetime) -> None:
        """The packed table's partitions for the months of the rows to pack."""
        found = database.query(
            f"SELECT min({tier.column}) FROM {tier.table}"  # noqa: S608 (constants)
            f" WHERE {tier.column} < %(cutoff)s",
            {"cutoff": cutoff},
        )
        oldest = found[0][0] if found else None
        if oldest is None:
            return
        scheme = SCHEMES[PACKED[tier.table]]
        month, needs = scheme.partition(database.read_time(oldest)), []
        while month.lower < cutoff:
            needs.append((scheme.table, month.lower))
            month = month.following()
        self._partitions.ensure(database, needs)
