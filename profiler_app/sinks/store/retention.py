"""Retention: raw rows, rollups and pods older than their retention leave the store.

Raw rows (``gpu_window``) go by whole UTC days, the rollups by whole buckets: PostgreSQL drops
whole partitions (``partitions.py``), each in its own short transaction; SQLite deletes in
batches of at most ``batch_rows`` rows, each its own transaction, so neither SQLite's writer
lock nor a PostgreSQL transaction is held for long, and one call runs at most ``max_batches``:
a backlog (a store that never had retention) drains over several calls. ``pod_usage`` rows go
in batches on both, by ``last_seen``, with the rollups' retention. Before raw rows go,
``store_horizon`` records the time before which they may be missing; the report reads a
partial hour there from its rollup. Traces recorded by ``gpu-profiler trace`` are kept:
someone asked for each of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from profiler_app.sinks.store.activity import ACTIVITY_TIERS
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.packing import PACKED_TIERS
from profiler_app.sinks.store.partitions import (
    DROP_LOCK_TIMEOUT,
    PARTITION_LOCK_ID,
    RAW,
    SCHEMES,
    partitions,
)
from profiler_app.sinks.store.rollups import ROLLUP_TIERS, bucket_start
from profiler_app.sinks.store.statements import Merge, merged, upsert_statement

log = logging.getLogger(__name__)

BATCH_ROWS = 5_000
MAX_BATCHES = 20  # per call: at most 100,000 rows, a few seconds of work
PRUNE_EVERY_SECONDS = 3600.0
DAY_SECONDS = 86400
# One batch per statement: the keys of the oldest rows, at most LIMIT of them (both backends);
# {cutoff} and {rows} become the driver's placeholders.
RAW_BATCH = (
    "DELETE FROM gpu_window WHERE id IN"
    " (SELECT id FROM gpu_window WHERE at < {cutoff} LIMIT {rows})"
)
POD_BATCH = (
    "DELETE FROM pod_usage WHERE (namespace, pod, node, pod_start_time) IN"
    " (SELECT namespace, pod, node, pod_start_time FROM pod_usage"
    " WHERE last_seen < {cutoff} LIMIT {rows})"
)
ROLLUP_BATCH = (  # SQLite only: PostgreSQL drops the rollups' partitions
    "DELETE FROM {table} WHERE rowid IN"
    " (SELECT rowid FROM {table} WHERE {column} < {{cutoff}} LIMIT {{rows}})"
)


class Retention:
    """Deletes what is older than its retention at most every ``every`` seconds, in bounded
    steps. ``raw_seconds``: raw rows; ``rollup_seconds``: rollups and pods (None: kept)."""

    def __init__(
        self,
        raw_seconds: float | None,
        rollup_seconds: float | None = None,
        *,
        batch_rows: int = BATCH_ROWS,
        max_batches: int = MAX_BATCHES,
        every: float = PRUNE_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.raw_seconds = raw_seconds
        self.rollup_seconds = rollup_seconds
        self.batch_rows = batch_rows
        self.max_batches = max_batches
        self.every = every
        self._clock = clock
        self._next_at: float | None = None  # None: due now

    def due(self) -> bool:
        return self._next_at is None or self._clock() >= self._next_at

    def prune(self, database: Database, now: datetime) -> int:
        """Removes what is older than ``now`` minus each retention; the rows deleted in batches
        (a dropped partition's rows are not counted). When ``max_batches`` did not finish the
        job, the next call is due at once."""
        raw_cutoff = self._cutoff(now, self.raw_seconds)
        rollup_cutoff = self._cutoff(now, self.rollup_seconds)
        steps = _Steps(database, self.batch_rows, self.max_batches)
        if database.backend == "postgresql":
            if raw_cutoff is not None:
                _drop_partitions(database, "gpu_window", raw_cutoff)
            if rollup_cutoff is not None:
                for tier in (*ROLLUP_TIERS, *ACTIVITY_TIERS, *PACKED_TIERS):
                    _drop_partitions(database, tier.table, rollup_cutoff)
        else:
            if raw_cutoff is not None:
                steps.run(RAW_BATCH, raw_cutoff, horizon=raw_cutoff)
            if rollup_cutoff is not None:
                for tier in (*ROLLUP_TIERS, *ACTIVITY_TIERS, *PACKED_TIERS):
                    batch = ROLLUP_BATCH.format(table=tier.table, column=tier.column)
                    steps.run(batch, bucket_start(rollup_cutoff, tier.seconds))
        if rollup_cutoff is not None:
            steps.run(POD_BATCH, rollup_cutoff)
        self._next_at = self._clock() + self.every if steps.finished else None
        if steps.deleted:
            log.info("retention: deleted %d row(s)", steps.deleted)
        return steps.deleted

    @staticmethod
    def _cutoff(now: datetime, seconds: float | None) -> datetime | None:
        """The start of the UTC day holding ``now`` minus ``seconds``: what is older goes."""
        if seconds is None:
            return None
        return bucket_start(now - timedelta(seconds=seconds), DAY_SECONDS)


class _Steps:
    """Batched deletes, at most ``max_batches`` full ones in all (a batch that finds fewer rows
    than it may delete ends its table's turn, and is not counted)."""

    def __init__(self, database: Database, batch_rows: int, max_batches: int) -> None:
        self.database = database
        self.batch_rows = batch_rows
        self.max_batches = max_batches
        self.batches = 0
        self.deleted = 0
        self.finished = True

    def run(self, batch: str, cutoff: datetime, *, horizon: datetime | None = None) -> None:
        """Deletes in batches what ``batch`` selects before ``cutoff``; ``horizon``: recorded
        in ``store_horizon`` in the transaction of the first batch that deletes rows."""
        database = self.database
        statement = batch.format(cutoff=database.param("cutoff"), rows=database.param("rows"))
        parameters = database.bind({"cutoff": cutoff, "rows": self.batch_rows})
        count = self.batch_rows
        while count == self.batch_rows:  # a full batch: there may be more
            if self.batches == self.max_batches:
                self.finished = False
                return
            with database.transaction() as cursor:
                cursor.execute(statement, parameters)
                count = cursor.rowcount
                if horizon is not None and count:
                    _record_horizon(database, cursor, "gpu_window", horizon)
                    horizon = None
            self.batches += count == self.batch_rows
            self.deleted += count


def _drop_partitions(database: Database, table: str, cutoff: datetime) -> None:
    """Drops each partition of ``table`` wholly before ``cutoff``, one per transaction, by one
    daemon at a time; a lock not had within ``DROP_LOCK_TIMEOUT`` (a long report reading the
    table) leaves the rest for the next call."""
    with database.transaction() as cursor:
        expired = [
            partition
            for partition, _ in partitions(cursor, SCHEMES[table])
            if partition.upper <= cutoff
        ]
    for partition in expired:
        with database.transaction() as cursor:
            cursor.execute(f"SELECT pg_try_advisory_xact_lock({PARTITION_LOCK_ID})")
            if not cursor.fetchone()[0]:
                return  # another daemon is at it
            cursor.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
            if table == RAW.table:  # no raw row before the cutoff once this one is gone
                _record_horizon(database, cursor, table, cutoff)
            cursor.execute(f"DROP TABLE IF EXISTS {partition.name}")
        log.info("retention: dropped partition %s", partition.name)


def _record_horizon(database: Database, cursor: Any, table: str, before: datetime) -> None:
    row = {"table_name": table, "removed_before": before.astimezone(UTC)}
    cursor.execute(
        upsert_statement(
            database,
            "store_horizon",
            row,
            ("table_name",),
            {"removed_before": merged(database, "store_horizon", "removed_before", Merge.LARGER)},
        ),
        database.bind(row),
    )
