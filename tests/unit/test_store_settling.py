"""Settling (sinks/store/settling.py): the last complete days of gpu_job_day made again from
gpu_day, so that days written by a daemon older than revision 0013 (a rolling update's nodes not
yet replaced) count in the node and GPU views. On SQLite and a real PostgreSQL."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from profiler_app.sinks.store import TableStore, sink
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.models import gpu_day, gpu_job_day
from profiler_app.sinks.store.rollups import GPU_DAY, GPU_HOUR
from profiler_app.sinks.store.settling import SETTLING_LOCK_ID, Settling
from profiler_app.sinks.store.urls import parse_store_url
from tests.unit.test_store_migration_rollups import assert_figures_equal
from tests.unit.test_store_rollups import at, cycle, gpu, report, rows

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]

DAY = timedelta(days=1)
MIDNIGHT = datetime(2026, 6, 1, tzinfo=UTC)  # at(3600): the rollup tests' next day


def write_days(store: TableStore, first: float, last: float, step: float = 900.0) -> None:
    """Cycles of two GPUs every ``step`` seconds from ``first`` to ``last`` (at()'s seconds),
    GPU 0 changing workload every hour."""
    seconds = first
    while seconds <= last:
        owner = f"job-{int(seconds // 3600) % 3}"
        profile = dataclasses.replace(gpu("0", util=seconds % 97), owner_name=owner)
        store.publish(cycle(seconds, [profile, gpu("1", "idle", pod=None)]))
        seconds += step


def old_writer(url: str, monkeypatch: pytest.MonkeyPatch) -> TableStore:
    """A store writing as a daemon before revision 0013 did: gpu_hour and gpu_day only."""
    monkeypatch.setattr(sink, "GPU_TIERS", (GPU_HOUR, GPU_DAY))
    return TableStore(url)


def figures(url: str, since: datetime, until: datetime, **options: Any) -> dict[str, Any]:
    got = report(url, since, until, views=("node", "gpu"), **options)
    return {"nodes": [asdict(n) for n in got.nodes], "gpus": [asdict(g) for g in got.gpus]}


def settle(url: str, now: datetime, **options: Any) -> int:
    database = Database(parse_store_url(url))
    try:
        return Settling(**options).settle(database, now)
    finally:
        database.close()


def test_days_an_old_daemon_wrote_count_once_settled(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two days written by an old daemon, then one by the current one: before settling the
    node and GPU views miss the old daemon's whole days; after, they equal the raw rows' report,
    and settling again finds nothing to replace."""
    store = old_writer(store_url, monkeypatch)
    write_days(store, -2 * 86400 + 3600, 3600 - 900)  # 30 and 31 May
    store.close()
    monkeypatch.undo()
    store = TableStore(store_url)
    write_days(store, 3600, 3 * 3600)  # 1 June, the current writer
    store.close()

    since, until = at(-2 * 86400 + 3600), at(4 * 3600)  # 30 May 00:00 to 1 June 03:00
    raw = figures(store_url, since, until, rollups=False)
    training = sum(g["hours_by_job_type"]["training"] for g in raw["gpus"])
    assert training == pytest.approx(2 * 24 + 2)  # 30 May 00:00 to the last cycle, 1 June 02:00
    # Unsettled, the whole days hold only what the current writer added: its first cycle's
    # 15 minutes back into 31 May.
    unsettled = figures(store_url, since, until)
    assert unsettled["gpus"][0]["hours_by_job_type"]["training"] == pytest.approx(2.25)

    written = settle(store_url, MIDNIGHT + timedelta(hours=3))
    assert written == len(rows(store_url, gpu_job_day)) - 2  # 1 June's own rows stay
    assert_figures_equal(figures(store_url, since, until), raw)

    settled = rows(store_url, gpu_job_day)
    assert settle(store_url, MIDNIGHT + timedelta(hours=3)) == 0  # the days agree now
    assert rows(store_url, gpu_job_day) == settled


def test_only_the_last_complete_days_are_replaced(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settling with ``days=1`` on 1 June replaces 31 May only: 30 May (older) and 1 June (not
    complete) keep what the current writer left there, here nothing."""
    store = old_writer(store_url, monkeypatch)
    write_days(store, -2 * 86400 + 3600, 3 * 3600)
    store.close()
    settle(store_url, MIDNIGHT + timedelta(hours=3), days=1)
    days = {row["day"] for row in rows(store_url, gpu_job_day)}
    assert days == {MIDNIGHT - DAY}


@pytest.mark.integration
def test_a_daemon_waits_its_turn_while_another_settles(postgres_server: PostgresServer) -> None:
    """One daemon settles at a time: with the advisory lock held elsewhere, settle() returns
    -1, writes nothing, and is due again only after its interval."""
    url = postgres_server.create_database()
    TableStore(url).close()  # migrated
    ticks = [0.0]
    settling = Settling(every=60.0, clock=lambda: ticks[0])
    database, other = Database(parse_store_url(url)), Database(parse_store_url(url))
    try:
        with other.transaction() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({SETTLING_LOCK_ID})")
            ticks[0] = 60.0
            assert settling.due()
            assert settling.settle(database, MIDNIGHT) == -1
            assert not settling.due()
        ticks[0] = 120.0
        assert settling.due()
        assert settling.settle(database, MIDNIGHT) == 0
    finally:
        database.close()
        other.close()


def test_the_store_settles_when_due(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TableStore runs settling after a cycle once it is due (here at once)."""
    store = old_writer(store_url, monkeypatch)
    write_days(store, -86400 + 3600, 3600 - 900)  # 31 May
    store.close()
    monkeypatch.undo()
    assert rows(store_url, gpu_job_day) == []
    monkeypatch.setattr(sink, "Settling", functools.partial(Settling, every=0.0))
    store = TableStore(store_url)
    write_days(store, 3600, 3600)  # one cycle at 1 June 00:00, its time in 31 May
    store.close()
    # 30 May: the old writer's first cycle covered its window back into it.
    assert {row["day"] for row in rows(store_url, gpu_job_day)} == {
        MIDNIGHT - 2 * DAY,
        MIDNIGHT - DAY,
    }


@pytest.mark.integration
def test_settling_while_a_daemon_writes_into_the_day_loses_and_doubles_nothing(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """31 May written by an old daemon on node-b; then, while one thread settles over and over
    and another adds node-b time to gpu_day only (an old daemon still writing), the current
    writer's cycles of node-a for the same day (late writes). After the old writes stop, the
    settling goes on during the last hours of node-a's cycles: every gpu_job_day row ends equal
    to gpu_day's rows summed, with no settling after the writes."""
    url = postgres_server.create_database()
    store = old_writer(url, monkeypatch)
    for seconds in range(-86400 + 3600, 3600, 900):
        store.publish(dataclasses.replace(cycle(seconds, [gpu("0")]), node="node-b"))
    store.close()
    monkeypatch.undo()

    done, old_writes_done = threading.Event(), threading.Event()
    settled: list[int] = []

    def settle_until_done() -> None:
        database = Database(parse_store_url(url))
        try:
            while not done.is_set():
                settled.append(Settling(every=0.0).settle(database, MIDNIGHT))  # 30, 31 May
        finally:
            database.close()

    def write_as_an_old_daemon() -> None:
        """More of node-b's time in gpu_day only, so that settling keeps replacing the day."""
        database = Database(parse_store_url(url))
        bump = "UPDATE gpu_day SET covered_seconds = covered_seconds + 1 WHERE node = 'node-b'"
        try:
            while not old_writes_done.wait(0.05):
                with database.transaction() as cursor:
                    cursor.execute(bump)
        finally:
            database.close()

    threads = [
        threading.Thread(target=settle_until_done),
        threading.Thread(target=write_as_an_old_daemon),
    ]
    for thread in threads:
        thread.start()
    try:
        store = TableStore(url)
        write_days(store, -86400 + 3600, -3600, step=300.0)  # with the old daemon writing
        # On a slow machine node-a's day can end before settling replaced it twice: the old
        # daemon and settling go on until it has (a loaded run failed here, 2026-11-30).
        deadline = time.monotonic() + 120
        while sum(written > 0 for written in settled) <= 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        old_writes_done.set()
        write_days(store, -3600 + 300, 3600 - 300, step=300.0)  # settling goes on
        store.close()
    finally:
        old_writes_done.set()
        done.set()
        for thread in threads:
            thread.join()
    assert sum(written > 0 for written in settled) > 1  # days replaced while node-a wrote

    sums: dict[tuple[Any, ...], dict[str, float]] = {}
    for row in rows(url, gpu_day):
        key = (row["day"], row["node"], row["gpu"], row["uuid"], row["gpu_i_id"], row["job_type"])
        total = sums.setdefault(key, {"covered_seconds": 0.0, "idle_gpu_seconds": 0.0})
        for column in total:
            total[column] += row[column]
    stored = {
        (r["day"], r["node"], r["gpu"], r["uuid"], r["gpu_i_id"], r["job_type"]): r
        for r in rows(url, gpu_job_day)
    }
    assert stored.keys() == sums.keys()
    for key, total in sums.items():
        for column, seconds in total.items():
            assert stored[key][column] == pytest.approx(seconds, rel=1e-9), (key, column)
