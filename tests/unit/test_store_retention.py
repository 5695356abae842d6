"""Retention of the table store: old rows leave in bounded batches, on SQLite and PostgreSQL.

Real stores: a SQLite file, and a database on a real PostgreSQL server (tests.support.postgres);
the last test runs the real ``gpu-profiler run --once``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from profiler_app.cli import main
from profiler_app.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile, PodUsage
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.retention import Retention
from profiler_app.sinks.store.urls import parse_store_url

pytest_plugins = ["tests.support.postgres"]

NOW = datetime(2026, 11, 23, tzinfo=UTC)
DAY = 86400.0


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


def fill(store_url: str, days_ago: list[int]) -> None:
    store = TableStore(store_url)
    try:
        for days in days_ago:
            store.publish(cycle(NOW - timedelta(days=days), pod=f"pod-{days}"))
    finally:
        store.close()


def test_rows_older_than_the_retention_go_and_newer_ones_stay(
    engine: sa.Engine, database: Database, store_url: str
) -> None:
    fill(store_url, [100, 95, 91, 89, 10, 0])
    assert counts(engine) == (12, 6)
    assert Retention(90 * DAY).prune(database, NOW) == 3 * 2 + 3
    assert counts(engine) == (6, 3)
    with engine.connect() as connection:
        oldest = connection.execute(sa.text("SELECT min(pod) FROM pod_usage")).scalar_one()
    assert oldest == "pod-0"  # pod-10 and pod-89 remain too; min() sorts text
    assert Retention(90 * DAY).prune(database, NOW) == 0


def test_a_backlog_is_deleted_in_bounded_batches_over_several_calls(
    engine: sa.Engine, database: Database, store_url: str
) -> None:
    fill(store_url, [200 + day for day in range(10)])  # 20 GPU rows, 10 pod rows, all old
    clock = [0.0]
    retention = Retention(90 * DAY, batch_rows=3, max_batches=4, every=3600, clock=lambda: clock[0])
    assert retention.due()
    assert retention.prune(database, NOW) == 12  # 4 batches of 3 rows, then it stops
    assert counts(engine) == (8, 10)
    assert retention.due()  # unfinished: due again at once
    assert retention.prune(database, NOW) == 11  # 8 GPU rows (3 batches), then 3 pod rows (1)
    assert retention.prune(database, NOW) == 7
    assert counts(engine) == (0, 0)
    assert not retention.due()  # finished: next in an hour
    clock[0] = 3600.0
    assert retention.due()


def test_the_sink_prunes_after_a_committed_cycle(engine: sa.Engine, store_url: str) -> None:
    fill(store_url, [120, 100])
    store = TableStore(store_url, retention_seconds=90 * DAY)
    try:
        store.publish(cycle(NOW, pod="now"))
    finally:
        store.close()
    assert counts(engine) == (2, 1)


def test_run_prunes_with_the_sqlite_default_and_keeps_with_none(
    tmp_path: Path, cli_environment: None
) -> None:
    """``gpu-profiler run --once`` on this GPU-less machine (real NVML without a driver, psutil)."""
    url = f"sqlite:///{tmp_path / 'profiler.db'}"
    now = datetime.now(UTC)
    store = TableStore(url)
    for days in (100, 1):
        store.publish(cycle(now - timedelta(days=days), pod=f"pod-{days}"))
    store.close()
    engine = create_store_engine(parse_store_url(url), create_file=False)
    argv = ["run", "--once", "--interval", "0.2s", "--sample-interval", "0.1s"]
    argv += ["--metrics-port", "0", "--store-url", url]
    try:
        assert main([*argv, "--retention", "none"]) == 0
        assert counts(engine) == (4, 2)
        assert main(argv) == 0  # SQLite's default: 90 days
        assert counts(engine) == (2, 1)
    finally:
        engine.dispose()
