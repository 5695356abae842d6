"""Trial results in the table store: ``trial_result`` rows of each ``gpu-profiler trial run``.

``TrialStore.record`` replaces a run's rows in one transaction; ``run_rows`` reads them back
(``trial report``), and ``reporting.trial_rows`` lists recent runs for ``report --by trial``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from profiler_app.sinks.store.models import trial_result
from profiler_app.sinks.store.opened import OpenedStore

COLUMNS = [column.name for column in trial_result.columns]


class TrialStore(OpenedStore):
    def record(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        """Replace the run's rows (each a ``trial_result`` row without ``run_id``)."""
        stamped = [{"run_id": run_id, "recorded_at": datetime.now(UTC), **row} for row in rows]
        try:
            with self._engine.begin() as connection:
                connection.execute(delete(trial_result).where(trial_result.c.run_id == run_id))
                if stamped:
                    connection.execute(insert(trial_result), stamped)
        except SQLAlchemyError as error:
            raise self._error(error) from None

    def run_rows(self, run_id: str) -> list[dict[str, Any]]:
        query = select(trial_result).where(trial_result.c.run_id == run_id)
        try:
            with self._engine.connect() as connection:
                rows = [dict(row) for row in connection.execute(query).mappings()]
        except SQLAlchemyError as error:
            raise self._error(error) from None
        return sorted(rows, key=lambda row: _trial_order(str(row["trial"])))


def _trial_order(name: str) -> tuple[int, str]:
    number = name.rsplit("-", 1)[-1]
    return (int(number), name) if number.isdigit() else (1 << 30, name)
