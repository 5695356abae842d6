"""SQLite on a full disk: the error names the cause, and the failed cycle's row is written once
there is room again.

A full disk is made with SQLite's own ``PRAGMA max_page_count`` on the store's connection:
writes past it fail with SQLITE_FULL, "database or disk is full", the error a full volume gives
(sqlite.org/rescode.html#full).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from profiler_app.sinks.store import StoreError, TableStore
from tests.support.store_cycles import T0, cycle, fetch, profile


def test_a_full_disk_is_named_and_the_cycle_is_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'profiler.db'}"
    store = TableStore(url)
    gpus = [profile(str(index)) for index in range(64)]
    store.publish(cycle(T0, gpus))
    connection = store._database._connect()
    pages = connection.execute("PRAGMA page_count").fetchone()[0]
    connection.execute(f"PRAGMA max_page_count = {pages}")
    failed_at = None
    for minute in range(1, 40):
        at = T0 + timedelta(minutes=minute)
        try:
            store.publish(cycle(at, gpus))
        except StoreError as error:
            failed_at = at
            message = str(error)
            break
    assert failed_at is not None, "the store never filled up: the check would prove nothing"
    assert "disk full" in message
    assert "closed database" not in message

    # Room again: the next cycle writes the failed one first, then its own.
    connection = store._database._connect()
    connection.execute("PRAGMA max_page_count = 1073741823")
    store.publish(cycle(failed_at + timedelta(minutes=1), gpus))
    store.close()
    written = {row[0] for row in fetch(url, "SELECT DISTINCT at FROM gpu_window")}
    assert len(written) == (failed_at - T0).seconds // 60 + 2


def test_the_error_without_the_fix_would_be_the_closed_database() -> None:
    """The cause the message hid: closing a cursor of a closed connection."""
    import sqlite3  # noqa: PLC0415

    connection = sqlite3.connect(":memory:")
    cursor = connection.cursor()
    connection.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
        cursor.close()
