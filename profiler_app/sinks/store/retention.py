"""Retention: the daemon's rows older than the retention period leave the store in batches.

Each batch deletes at most ``batch_rows`` rows in its own transaction, so neither SQLite's
writer lock nor a PostgreSQL transaction is held for long, and one call runs at most
``max_batches``: a backlog (a store that never had retention) drains over several cycles.
Traces recorded by ``gpu-profiler trace`` are kept: someone asked for each of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from profiler_app.sinks.store.dbapi import Database

log = logging.getLogger(__name__)

DEFAULT_SQLITE_RETENTION = "90d"
BATCH_ROWS = 5_000
MAX_BATCHES = 20  # per call: at most 100,000 rows, a few seconds of work
PRUNE_EVERY_SECONDS = 3600.0
# One batch per statement: the keys of the oldest rows, at most LIMIT of them (both backends);
# {cutoff} and {rows} become the driver's placeholders.
BATCHES = (
    "DELETE FROM gpu_window WHERE id IN"
    " (SELECT id FROM gpu_window WHERE at < {cutoff} LIMIT {rows})",
    "DELETE FROM pod_usage WHERE (namespace, pod, node, pod_start_time) IN"
    " (SELECT namespace, pod, node, pod_start_time FROM pod_usage"
    " WHERE last_seen < {cutoff} LIMIT {rows})",
)


class Retention:
    """Deletes rows older than ``seconds`` at most every ``every`` seconds, in bounded batches."""

    def __init__(
        self,
        seconds: float,
        *,
        batch_rows: int = BATCH_ROWS,
        max_batches: int = MAX_BATCHES,
        every: float = PRUNE_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.batch_rows = batch_rows
        self.max_batches = max_batches
        self.every = every
        self._clock = clock
        self._next_at: float | None = None  # None: due now

    def due(self) -> bool:
        return self._next_at is None or self._clock() >= self._next_at

    def prune(self, database: Database, now: datetime) -> int:
        """Deletes what is older than ``now`` minus the retention; the number of rows deleted.

        When ``max_batches`` did not finish the job, the next call is due at once.
        """
        cutoff = now - timedelta(seconds=self.seconds)
        parameters = database.bind({"cutoff": cutoff, "rows": self.batch_rows})
        deleted = 0
        batches = 0
        finished = True
        for batch in BATCHES:
            statement = batch.format(cutoff=database.param("cutoff"), rows=database.param("rows"))
            count = self.batch_rows
            while count == self.batch_rows:  # a full batch: there may be more
                if batches == self.max_batches:
                    finished = False
                    break
                with database.transaction() as cursor:
                    cursor.execute(statement, parameters)
                    count = cursor.rowcount
                batches += 1
                deleted += count
        self._next_at = self._clock() + self.every if finished else None
        if deleted:
            log.info("retention: deleted %d row(s) older than %s", deleted, cutoff.isoformat())
        return deleted
