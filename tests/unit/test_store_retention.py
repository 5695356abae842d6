"""Retention of the table store: old rows leave in bounded batches, on SQLite and PostgreSQL.

Real stores: a SQLite file, and a database on a real PostgreSQL server (tests.support.postgres);
the last test runs the real ``gpu-profiler run --once``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from profiler_app.cli import main
from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile, PodUsage
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import gpu_window, store_horizon
from profiler_app.sinks.store.partitions import SCHEMES
from profiler_app.sinks.store.retention import Retention
from profiler_app.sinks.store.urls import parse_store_url

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]

NOW = datetime(2026, 11, 23, tzinfo=UTC)
DAY = 86400.0
ROLLUPS = tuple(table for table in SCHEMES if table != "gpu_window")  # monthly partitions


def cycle(at: datetime, gpus: int = 2, pod: str | None = None) -> CycleResult:
    profiles = [
        GpuProfile(
            gpu=str(index),
            uuid=f"GPU-{index}",
            hostname="node-a",
            job_type="idle",
            period_seconds=None,
            stats={GPU_UTIL: FieldStats(max=1.0, p95=1.0, mean=0.5, idle_fraction=1.0)},
        )
        for index in range(gpus)
    ]
    pods = [PodUsage("ml", pod, "node-a", at, gpus=("0",), first_seen=at, last_seen=at)]
    return CycleResult("node-a", at, 1800.0, profiles, pods if pod else [])


@pytest.fixture
def engine(store_url: str) -> Iterator[sa.Engine]:
    TableStore(store_url).close()
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    yield engine
    engine.dispose()


@pytest.fixture
def database(engine: sa.Engine, store_url: str) -> Iterator[Database]:
    """The daemon's DB-API connection to the same (migrated) store."""
    database = Database(parse_store_url(store_url))
    yield database
    database.close()


def counts(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        windows = connection.execute(sa.text("SELECT count(*) FROM gpu_window")).scalar_one()
        pods = connection.execute(sa.text("SELECT count(*) FROM pod_usage")).scalar_one()
    return windows, pods


def partition_names(engine: sa.Engine) -> set[str]:
    with engine.connect() as connection:
        query = "SELECT relname FROM pg_class WHERE relispartition AND relkind = 'r'"
        rows = connection.execute(sa.text(query))
        return {name for (name,) in rows}


def scalar(engine: sa.Engine, query: str) -> Any:
    with engine.connect() as connection:
        return connection.execute(sa.text(query)).scalar()


def fill(store_url: str, days_ago: list[int]) -> None:
    store = TableStore(store_url)
    try:
        for days in days_ago:
            store.publish(cycle(NOW - timedelta(days=days), pod=f"pod-{days}"))
    finally:
        store.close()


def test_raw_rows_older_than_the_retention_go_by_whole_days_and_the_rollups_stay(
    engine: sa.Engine, database: Database, store_url: str
) -> None:
    fill(store_url, [100, 95, 91, 89, 10, 0])
    covered = scalar(engine, "SELECT sum(covered_seconds) FROM gpu_hour")
    assert counts(engine) == (12, 6)
    # The cutoff, 24 Aug 12:00, goes back to the start of its day: the rows of 24 Aug 00:00
    # stay until the whole day is past.
    Retention(91 * DAY).prune(database, NOW + timedelta(hours=12))
    assert counts(engine) == (8, 6)  # pods go with the rollups
    with engine.connect() as connection:
        oldest = connection.execute(sa.select(sa.func.min(gpu_window.c.at))).scalar()
        horizon = connection.execute(sa.select(store_horizon.c.removed_before)).scalar()
    assert oldest == NOW - timedelta(days=91)
    assert horizon == datetime(2026, 8, 24, tzinfo=UTC)
    assert scalar(engine, "SELECT sum(covered_seconds) FROM gpu_hour") == covered
    Retention(90 * DAY).prune(database, NOW)
    assert counts(engine) == (6, 6)


def made_by_the_migration(
    raw_cutoff: datetime | None = None, rollup_cutoff: datetime | None = None
) -> set[str]:
    """The partitions the migration creates for today (and tomorrow, and the next month), still
    there after retention with these cutoffs."""
    now = datetime.now(UTC)
    raw = [SCHEMES["gpu_window"].partition(now + timedelta(days=days)) for days in (0, 1)]
    months = (now, now.replace(day=1) + timedelta(days=32))
    rollups = [SCHEMES[table].partition(month) for table in ROLLUPS for month in months]
    return {p.name for p in raw if raw_cutoff is None or p.upper > raw_cutoff} | {
        p.name for p in rollups if rollup_cutoff is None or p.upper > rollup_cutoff
    }


@pytest.mark.integration
def test_postgresql_drops_whole_partitions(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    fill(url, [3, 2, 1, 0])  # 20 to 23 November
    engine = create_store_engine(parse_store_url(url), create_file=False)
    database = Database(parse_store_url(url))
    try:
        days = {f"gpu_window_p202611{day}" for day in range(20, 25)}  # 24th: created ahead
        months = {f"{table}_p2026{month}" for table in ROLLUPS for month in ("11", "12")}
        assert partition_names(engine) == days | months | made_by_the_migration()
        cutoff = datetime(2026, 11, 21, tzinfo=UTC)
        Retention(2 * DAY).prune(database, NOW + timedelta(hours=12))  # cutoff 21 Nov 00:00
        assert partition_names(engine) == (
            days - {"gpu_window_p20261120"} | months | made_by_the_migration(cutoff)
        )
        assert counts(engine) == (6, 4)
        # Rollups: a month goes once all of it is older than the cutoff (12 December here).
        Retention(2 * DAY, 20 * DAY).prune(database, datetime(2027, 1, 1, tzinfo=UTC))
        cutoffs = datetime(2026, 12, 30, tzinfo=UTC), datetime(2026, 12, 12, tzinfo=UTC)
        assert partition_names(engine) == (
            {f"{table}_p202612" for table in ROLLUPS} | made_by_the_migration(*cutoffs)
        )
        assert counts(engine) == (0, 0)
    finally:
        database.close()
        engine.dispose()


def test_rollups_and_pods_older_than_their_retention_go(
    engine: sa.Engine, database: Database, store_url: str
) -> None:
    fill(store_url, [200, 10])  # 200 days ago: May, a month wholly before the cutoff
    Retention(None, 90 * DAY).prune(database, NOW)
    assert counts(engine) == (4, 1)  # raw rows are kept (no raw retention)
    for table in ("gpu_hour", "gpu_day"):
        assert scalar(engine, f"SELECT count(*) FROM {table}") == 2, table
    assert scalar(engine, "SELECT min(pod) FROM pod_usage") == "pod-10"


def test_a_backlog_is_deleted_in_bounded_batches_over_several_calls(tmp_path: Path) -> None:
    """SQLite deletes in batches (PostgreSQL drops partitions)."""
    url = f"sqlite:///{tmp_path / 'profiler.db'}"
    fill(url, [200 + day for day in range(10)])  # 20 GPU rows, 10 pod rows, all old
    engine = create_store_engine(parse_store_url(url), create_file=False)
    database = Database(parse_store_url(url))
    clock = [0.0]
    retention = Retention(
        90 * DAY, 90 * DAY, batch_rows=3, max_batches=4, every=3600, clock=lambda: clock[0]
    )
    try:
        assert retention.due()
        assert retention.prune(database, NOW) == 12  # 4 batches of 3 rows, then it stops
        assert counts(engine) == (8, 10)
        assert retention.due()  # unfinished: due again at once
        calls = 1
        while retention.due():
            retention.prune(database, NOW)
            calls += 1
        assert counts(engine) == (0, 0)
        assert scalar(engine, "SELECT count(*) FROM gpu_hour") == 0
        assert calls > 2
        clock[0] = 3600.0
        assert retention.due()  # finished: next in an hour
    finally:
        database.close()
        engine.dispose()


def test_the_sink_prunes_after_a_committed_cycle(engine: sa.Engine, store_url: str) -> None:
    fill(store_url, [120, 100])
    store = TableStore(store_url, retention_seconds=90 * DAY, rollup_retention_seconds=110 * DAY)
    try:
        store.publish(cycle(NOW, pod="now"))
    finally:
        store.close()
    assert counts(engine) == (2, 2)  # raw: only now's; pods: 100 days and now


def test_run_prunes_with_the_defaults_and_keeps_with_none(
    tmp_path: Path, cli_environment: None
) -> None:
    """``gpu-profiler run --once`` on this GPU-less machine (real NVML without a driver, psutil)."""
    url = f"sqlite:///{tmp_path / 'profiler.db'}"
    # Cycles at noon, 12-36 hours ago and earlier: a 30-minute window never crosses midnight
    # (run just after midnight, each spanned two days of gpu_day).
    noon = (datetime.now(UTC) - timedelta(days=1)).replace(hour=12, minute=0, second=0)
    store = TableStore(url)
    for days in (499, 99, 0):
        store.publish(cycle(noon - timedelta(days=days), pod=f"pod-{days}"))
    store.close()
    engine = create_store_engine(parse_store_url(url), create_file=False)
    argv = ["run", "--once", "--interval", "0.2s", "--sample-interval", "0.1s"]
    argv += ["--metrics-port", "0", "--store-url", url]
    try:
        assert main([*argv, "--retention", "none", "--rollup-retention", "none"]) == 0
        assert counts(engine) == (6, 3)
        assert main(argv) == 0  # raw rows 14 days, rollups and pods 400 days
        assert counts(engine) == (2, 2)
        assert scalar(engine, "SELECT count(DISTINCT day) FROM gpu_day") == 2
    finally:
        engine.dispose()
