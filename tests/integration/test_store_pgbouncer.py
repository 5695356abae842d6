"""The daemon's store through a real PgBouncer in transaction mode, in front of a real PostgreSQL
that is killed and restarted (tests/support/pgbouncer.py, tests/support/postgres.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import psycopg
import pytest

from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.sinks.store import StoreError, TableStore
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.urls import parse_store_url

if TYPE_CHECKING:
    from tests.support.pgbouncer import PgBouncer
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres", "tests.support.pgbouncer"]
pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
WINDOW = 1800.0


def cycle(node: str, seconds: float) -> CycleResult:
    stats = {GPU_UTIL: FieldStats(max=50.0, p95=40.0, mean=30.0, idle_fraction=0.1)}
    gpus = [
        GpuProfile(str(index), f"GPU-{node}-{index}", node, "inference", None, stats)
        for index in range(2)
    ]
    return CycleResult(node, T0 + timedelta(seconds=seconds), WINDOW, gpus)


def scalar(url: str, query: str) -> object:
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(query).fetchone()
        return None if row is None else row[0]


def hold_a_server_connection(bouncer: PgBouncer, database: str) -> psycopg.Connection:
    """A client in an open transaction: PgBouncer must give the next one another server
    connection (it hands out the most recently used idle one first)."""
    holder = psycopg.connect(bouncer.url(database), autocommit=True)
    holder.execute("BEGIN")
    holder.execute("SELECT 1")
    return holder


def test_server_side_prepared_statements_break_in_transaction_mode(
    pgbouncer: PgBouncer, postgres_server: PostgresServer
) -> None:
    """The control: psycopg preparing statements (its default after 5 runs; at once here)
    fails once PgBouncer moves the client to a server connection that never prepared them."""
    name = postgres_server.create_database().rsplit("/", 1)[1]
    client = psycopg.connect(pgbouncer.url(name), autocommit=True, prepare_threshold=0)
    try:
        client.execute("SELECT %s::int", [1])  # prepared on the server connection it got
        holder = hold_a_server_connection(pgbouncer, name)
        try:
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                client.execute("SELECT %s::int", [2])
        finally:
            holder.close()
    finally:
        client.close()


def test_the_daemons_writes_work_through_pgbouncer_in_transaction_mode(
    pgbouncer: PgBouncer, postgres_server: PostgresServer
) -> None:
    """Two daemons, more cycles than psycopg's prepare threshold, their transactions moved
    between server connections: every cycle is written, nothing is prepared."""
    name = postgres_server.create_database().rsplit("/", 1)[1]
    url = pgbouncer.url(name)
    stores = [TableStore(url), TableStore(url)]
    holder = None
    try:
        for step in range(12):
            if step == 6:  # from now on the next transactions get another server connection
                holder = hold_a_server_connection(pgbouncer, name)
            for number, store in enumerate(stores):
                store.publish(cycle(f"node-{number}", 30.0 * step))
    finally:
        if holder is not None:
            holder.close()
        for store in stores:
            store.close()
    direct = postgres_server.url(name)
    assert scalar(direct, "SELECT count(*) FROM gpu_window") == 12 * 2 * 2
    assert scalar(direct, "SELECT sum(covered_seconds) FROM gpu_hour") == pytest.approx(
        2 * 2 * (WINDOW + 11 * 30.0)
    )
    # The daemon's own connection is set so: no statement is ever prepared.
    database = Database(parse_store_url(url))
    try:
        for _ in range(10):
            database.query("SELECT 1")
        assert database.query("SELECT count(*) FROM pg_prepared_statements") == [(0,)]
    finally:
        database.close()


def test_a_killed_postgresql_behind_pgbouncer_loses_nothing_committed(
    pgbouncer: PgBouncer, postgres_server: PostgresServer
) -> None:
    """PostgreSQL crashes (``pg_ctl stop -m immediate``) and comes back under a daemon writing
    through PgBouncer: the writes in between fail, and so do those in PgBouncer's login retry
    delay after the restart (the daemon backs off meanwhile); every committed cycle is in the
    store, and the first row after the outage covers it (it is shorter than the window), so the
    covered time has no hole."""
    name = postgres_server.create_database().rsplit("/", 1)[1]
    store = TableStore(pgbouncer.url(name))
    committed: list[float] = []
    failed: list[float] = []
    try:
        for step in range(5):
            store.publish(cycle("node-a", 30.0 * step))
            committed.append(30.0 * step)
        postgres_server.stop()
        try:
            for step in range(5, 8):
                with pytest.raises(StoreError, match="database"):
                    store.publish(cycle("node-a", 30.0 * step))
                failed.append(30.0 * step)
        finally:
            postgres_server.resume()
        step = 8
        deadline = time.monotonic() + 90
        while len(committed) < 9 and time.monotonic() < deadline:
            try:
                store.publish(cycle("node-a", 30.0 * step))
                committed.append(30.0 * step)
            except StoreError:
                failed.append(30.0 * step)
                time.sleep(1.0)  # the daemon's back-off, shortened
            step += 1
    finally:
        store.close()
    direct = postgres_server.url(name)
    stored = scalar(direct, "SELECT count(DISTINCT at) FROM gpu_window")
    # The oldest failed cycle (150 s) is kept and written first once the database is back.
    assert stored == len(committed) + 1
    # 30 min for the first row, then every 30 s up to the last: the outage is covered.
    covered = WINDOW + committed[-1] - committed[0]
    assert scalar(direct, "SELECT sum(covers_seconds) FROM gpu_window") == pytest.approx(
        2 * covered
    )
    assert scalar(direct, "SELECT sum(covered_seconds) FROM gpu_day") == pytest.approx(2 * covered)
    assert failed[:3] == [150.0, 180.0, 210.0]
    assert set(failed).isdisjoint(committed)
