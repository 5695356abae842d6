"""The table store against a real PostgreSQL that restarts, goes away and is shared.

The server is tests/support/postgres.py's throwaway instance (initdb + pg_ctl on 127.0.0.1).
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from alembic import command

from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.sinks.store import StoreError, TableStore
from profiler_app.sinks.store.engine import MIGRATION_LOCK_ID, alembic_config, create_store_engine
from profiler_app.sinks.store.urls import parse_store_url

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]
pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cycle(n: int) -> CycleResult:
    stats = {GPU_UTIL: FieldStats(max=50.0, p95=40.0, mean=30.0, idle_fraction=0.1)}
    profile = GpuProfile("0", "GPU-0", "node-a", "inference", None, stats)
    return CycleResult("node-a", T0 + timedelta(seconds=30 * n), 1800.0, [profile])


def count_rows(url: str) -> int:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return int(connection.scalar(sa.text("SELECT count(*) FROM gpu_window")) or 0)
    finally:
        engine.dispose()


def test_store_survives_a_database_restart(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    store = TableStore(url)
    store.publish(cycle(0))
    postgres_server.stop()
    try:
        with pytest.raises(StoreError, match="database unavailable"):
            store.publish(cycle(1))
    finally:
        postgres_server.resume()
    store.publish(cycle(2))  # the pool notices the dead connection and reconnects
    store.close()
    assert count_rows(url) == 3  # the failed cycle 1 is written first once the database is back


def test_store_started_while_database_is_down_migrates_later(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres_server.create_database()
    postgres_server.stop()
    try:
        with caplog.at_level(logging.WARNING):
            store = TableStore(url)
        assert "will retry on the next cycle" in caplog.text
    finally:
        postgres_server.resume()
    store.publish(cycle(0))
    store.close()
    assert count_rows(url) == 1


def test_a_daemon_starting_during_another_migration_waits_for_it(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Many nodes share one database and may start together: the second migration must wait.

    The test plays the first daemon: it migrates in a transaction it keeps open. Without the
    migration lock the second daemon's CREATE TABLE would fail on a duplicate key once the first
    commits (it would log a warning and retry next cycle); with it, the second waits, then finds
    the schema current.
    """
    url = postgres_server.create_database()
    first = create_store_engine(parse_store_url(url), create_file=False)
    outcome: list[BaseException | None] = []

    def second_daemon() -> None:
        try:
            TableStore(url).close()
            outcome.append(None)
        except BaseException as error:  # reported by the assertion below
            outcome.append(error)

    caplog.set_level(logging.WARNING)
    with first.connect() as connection:
        transaction = connection.begin()
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        waiter = threading.Thread(target=second_daemon)
        waiter.start()
        waiter.join(timeout=2)
        assert waiter.is_alive(), "the second migration did not wait for the first"
        transaction.commit()
    waiter.join(timeout=60)
    first.dispose()
    assert outcome == [None]
    assert "will retry" not in caplog.text
    assert count_rows(url) == 0
