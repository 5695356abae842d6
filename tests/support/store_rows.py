"""Raw ``gpu_window`` rows written into a store as the daemon's writer writes a cycle's: one
transaction per cycle (the rows of one ``at``), the writer's own insert and rollup upserts
(``TableStore``'s), PostgreSQL's partitions made first. For tests whose rows are easier to state
than the cycles that would make them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import groupby
from typing import Any

from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.models import gpu_window
from profiler_app.sinks.store.partitions import SCHEMES

_COLUMNS = [column.name for column in gpu_window.columns if column.name != "id"]


def write_rows(url: str, rows: Iterable[Mapping[str, Any]]) -> None:
    """Writes ``rows`` (gpu_window's columns; those left out are NULL, ``gpu_i_id`` '') and
    their rollups, cycle by cycle in time order."""
    complete = [{**dict.fromkeys(_COLUMNS), "gpu_i_id": "", **row} for row in rows]
    complete.sort(key=lambda row: row["at"])
    store = TableStore(url)  # migrated to the head
    database = store._database  # the writer's own connection and statements
    try:
        for at, cycle in groupby(complete, key=lambda row: row["at"]):
            cycle_rows = list(cycle)
            if store._partitions is not None:
                longest = max(row["covers_seconds"] for row in cycle_rows)
                needs = [(table, at) for table in SCHEMES] + [
                    (table, at.__class__.fromtimestamp(at.timestamp() - longest, at.tzinfo))
                    for table in SCHEMES
                    if table != "gpu_window"
                ]
                store._partitions.ensure(database, needs)
            with database.transaction() as cursor:
                store._insert_gpu_windows(cursor, cycle_rows)
                store._upsert_rollups(cursor, cycle_rows, [])
    finally:
        store.close()
