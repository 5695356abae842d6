"""The writer's rollups, its cadence (``store_interval_seconds``) and the report's edges, on
SQLite and a real PostgreSQL (``integration``, tests/support/postgres.py)."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from profiler_app.core.model import FB_USED, GPU_UTIL, CycleResult, FieldStats, GpuProfile, PodUsage
from profiler_app.reports.history import build_report
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.history import Span, spans
from profiler_app.sinks.store.models import gpu_day, gpu_hour, gpu_job_day, gpu_window, pod_hour
from profiler_app.sinks.store.partitions import SCHEMES, PartitionKeeper
from profiler_app.sinks.store.retention import Retention
from profiler_app.sinks.store.rollups import (
    GPU_DAY,
    GPU_HOUR,
    GPU_JOB_DAY,
    gpu_rollup_rows,
    pieces,
    pod_rollup_rows,
)
from profiler_app.sinks.store.urls import parse_store_url

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]

H = datetime(2026, 5, 31, 23, 0, tzinfo=UTC)  # the last hour of a day and of a month
WINDOW = 1800.0


def at(seconds: float) -> datetime:
    return H + timedelta(seconds=seconds)


def gpu(
    index: str = "0",
    job_type: str = "training",
    *,
    util: float = 90.0,
    idle: float = 0.25,
    fb: float = 2048.0,
    pod: str | None = "train-0",
    period: float | None = 12.0,
) -> GpuProfile:
    return GpuProfile(
        index,
        f"GPU-{index}",
        "node-a",
        job_type,
        period,
        {GPU_UTIL: FieldStats(util, util, util / 2, idle), FB_USED: FieldStats(fb, fb, fb, 0.0)},
        namespace="ml" if pod else None,
        pod=pod,
        owner_kind="PyTorchJob" if pod else None,
        owner_name="llama" if pod else None,
    )


def cycle(
    seconds: float, gpus: list[GpuProfile], pods: list[PodUsage] | None = None
) -> CycleResult:
    return CycleResult("node-a", at(seconds), WINDOW, gpus, pods or [])


def rows(url: str, table: sa.Table) -> list[dict[str, Any]]:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            query = sa.select(table).order_by(*table.primary_key.columns)
            return [dict(row) for row in connection.execute(query).mappings()]
    finally:
        engine.dispose()


def report(url: str, since: datetime, until: datetime, **options: Any) -> Any:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return build_report(connection, since=since, until=until, **options)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("end", "covers", "expected"),
    [
        (at(600), 300.0, [(H, 300.0)]),
        (at(15), 30.0, [(H - timedelta(hours=1), 15.0), (H, 15.0)]),
        (at(0), 30.0, [(H - timedelta(hours=1), 30.0)]),  # ends on the hour: the hour before
        (at(0), 0.0, [(H, 0.0)]),  # covers nothing: the bucket holding its time
        (at(7200.5), 7200.0, [(H, 3599.5), (H + timedelta(hours=1), 3600.0), (at(7200), 0.5)]),
    ],
)
def test_a_rows_covered_time_is_split_over_the_hours_it_spans(
    end: datetime, covers: float, expected: list[tuple[datetime, float]]
) -> None:
    assert list(pieces(end, covers, 3600)) == expected


def test_a_range_is_raw_edges_around_whole_hours_and_days() -> None:
    since, until = at(-2 * 86400 + 5400), at(86400 + 7260)  # 30 May 00:30 to 2 June 01:01
    assert spans(since, until) == [
        Span(since, at(-2 * 86400 + 7200), "raw"),
        Span(at(-2 * 86400 + 7200), at(-86400 + 3600), "hour"),  # to midnight
        Span(at(-86400 + 3600), at(86400 + 3600), "day"),
        Span(at(86400 + 3600), at(86400 + 7200), "hour"),
        Span(at(86400 + 7200), until, "raw"),
    ]
    assert spans(at(60), at(120)) == [Span(at(60), at(120), "raw")]
    assert spans(at(60), at(3700)) == [
        Span(at(60), at(3600), "raw"),
        Span(at(3600), at(3700), "raw"),
    ]
    horizon = at(3600)  # raw rows before it are gone: edges there are estimated
    assert spans(at(60), at(7300), horizon=horizon) == [
        Span(at(60), at(3600), "estimate"),
        Span(at(3600), at(7200), "hour"),
        Span(at(7200), at(7300), "raw"),
    ]


def test_rollups_hold_each_hours_and_days_covered_time_and_peaks(store_url: str) -> None:
    store = TableStore(store_url)
    usage = PodUsage("ml", "train-0", "node-a", H, ("0", "1"), cpu_util_max=250.0)
    store.publish(cycle(-600, [gpu("0"), gpu("1", util=40.0)], [usage]))  # first rows: 30 min
    store.publish(cycle(1200, [gpu("0", period=10.0), gpu("1", fb=100.0, idle=1.0)], [usage]))
    store.publish(cycle(3600, [gpu("0", "idle", pod=None, period=None)]))  # 1 h ahead: June
    store.close()

    hours = rows(store_url, gpu_hour)
    summary = [
        (r["hour"], r["gpu"], r["job_type"], r["memory_held"], r["pod"], r["covered_seconds"])
        for r in hours
    ]
    before = H - timedelta(hours=1)
    assert summary == [
        (before, "0", "training", True, "train-0", 2400.0),  # 22:20 to 23:00
        (before, "1", "training", False, "train-0", 600.0),  # memory no longer held
        (before, "1", "training", True, "train-0", 1800.0),
        (H, "0", "idle", True, "", 1800.0),  # covers 30 min (the window): 23:30 to 00:00
        (H, "0", "training", True, "train-0", 1200.0),
        (H, "1", "training", False, "train-0", 1200.0),
    ]
    first = hours[0]
    assert first["idle_gpu_seconds"] == 2400.0 * 0.25
    assert (first["namespace"], first["owner_kind"], first["owner_name"]) == (
        "ml",
        "PyTorchJob",
        "llama",
    )
    assert first["covers_max_seconds"] == 1800.0
    assert (first["period_seconds_min"], first["period_seconds_max"]) == (10.0, 12.0)
    assert first["period_weighted_sum"] == 1800.0 * 12 + 600.0 * 10
    assert first["period_covered_seconds"] == 2400.0
    assert hours[1]["idle_gpu_seconds"] == 600.0
    assert (hours[3]["period_covered_seconds"], hours[3]["period_seconds_max"]) == (0.0, None)

    days = rows(store_url, gpu_day)
    assert sum(r["covered_seconds"] for r in days) == sum(r["covered_seconds"] for r in hours)
    assert {r["day"] for r in days} == {datetime(2026, 5, 31, tzinfo=UTC)}  # 00:00 ends it

    pods = [
        (r["hour"], r["gpus"], r["gpu_seconds"], r["util_max"], r["cpu_util_max"])
        for r in rows(store_url, pod_hour)
    ]
    assert pods == [(before, 2, 4800.0, 90.0, 250.0), (H, 2, 2400.0, 90.0, 250.0)]


def test_a_gpus_day_is_one_row_per_job_type_however_many_workloads_shared_it(
    store_url: str,
) -> None:
    """gpu_job_day (revision 0013) sums gpu_day's rows of a GPU, job type and day over their
    workloads, and the node and GPU views read it: they give the same figures with gpu_day
    gone, where the waste view, which needs the workloads, has nothing left."""
    store = TableStore(store_url)
    for step in range(12):  # 22:00 to 23:55 on 31 May: a workload change every 20 minutes
        owner = ("llama", "mistral", None)[step // 2 % 3]
        profile = dataclasses.replace(
            gpu("0", util=10.0 * step, fb=(2048.0, 100.0)[step % 2]),
            owner_name=owner,
            pod=None if owner is None else f"{owner}-0",
        )
        store.publish(cycle(-3600 + 600 * step, [profile, gpu("1", "idle", pod=None)]))
    store.close()

    days = rows(store_url, gpu_day)
    per_job = rows(store_url, gpu_job_day)
    assert len(days) > len(per_job) == 2  # GPU 0 training, GPU 1 idle
    for row in per_job:
        same = [
            day for day in days if (day["gpu"], day["job_type"]) == (row["gpu"], row["job_type"])
        ]
        assert row["day"] == datetime(2026, 5, 31, tzinfo=UTC)
        assert row["covered_seconds"] == pytest.approx(sum(d["covered_seconds"] for d in same))
        assert row["idle_gpu_seconds"] == pytest.approx(sum(d["idle_gpu_seconds"] for d in same))
        assert row["util_max"] == max(d["util_max"] for d in same)
        assert row["fb_used_max_mib"] == max(d["fb_used_max_mib"] for d in same)
    assert {(r["gpu"], r["util_max"]) for r in per_job} == {("0", 110.0), ("1", 90.0)}

    since, until = at(-2 * 86400), at(3600)  # two whole days and edges around them
    before = report(store_url, since, until, views=("node", "gpu", "waste"))
    assert before.waste
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.begin() as connection:
            connection.execute(sa.delete(gpu_day))
    finally:
        engine.dispose()
    after = report(store_url, since, until, views=("node", "gpu", "waste"))
    assert (after.gpus, after.nodes) == (before.gpus, before.nodes)
    assert after.waste == []


def test_a_zero_length_row_on_an_hour_counts_in_the_hour_it_opens(store_url: str) -> None:
    store = TableStore(store_url)
    store.publish(cycle(-60, [gpu(util=50.0)]))
    store.publish(cycle(0, [gpu(util=60.0)]))
    store.publish(cycle(0, [gpu("0", "idle", util=99.0)]))  # the same time again: covers 0
    store.close()
    for rollups in (True, False):
        before = report(store_url, H - timedelta(hours=1), H, views=("gpu",), rollups=rollups)
        after = report(store_url, H, H + timedelta(hours=1), views=("gpu",), rollups=rollups)
        assert before.gpus[0].util_max_percent == 60.0
        assert before.gpus[0].hours_by_job_type["training"] == pytest.approx(31 / 60)
        assert after.gpus[0].util_max_percent == 99.0
        assert sum(after.gpus[0].hours_by_job_type.values()) == 0.0


def test_a_partial_hour_whose_raw_rows_were_removed_is_estimated_from_its_rollup(
    store_url: str,
) -> None:
    store = TableStore(store_url)
    for minute in range(-80, 24 * 60 + 1):  # every minute, 30 May 22:40 to 1 June 00:00
        store.publish(cycle(-86400 + 3600 + minute * 60, [gpu(pod=None)]))
    store.close()
    database = Database(parse_store_url(store_url))
    try:
        Retention(0.5 * 86400).prune(database, at(3600))  # raw rows before 31 May go
    finally:
        database.close()
    since, until = at(-86400 + 1800), at(2 * 3600)  # 30 May 23:30 to 1 June 01:00
    got = report(store_url, since, until, views=("gpu",))
    assert got.gpus[0].hours_by_job_type["training"] == pytest.approx(24.5)  # 23:30 to 00:00
    raw = report(store_url, since, until, views=("gpu",), rollups=False)
    assert raw.gpus[0].hours_by_job_type["training"] == pytest.approx(24 + 1 / 60)
    assert got.notes == [
        "raw rows before 2026-05-31T00:00:00Z were removed by retention: "
        "2026-05-30T23:30:00Z to 2026-05-31T00:00:00Z is estimated from its hourly rollup"
    ]


def test_a_store_interval_writes_once_a_slot_and_covers_every_cycle(store_url: str) -> None:
    store = TableStore(store_url, store_interval_seconds=300.0)
    for second in range(0, 1000, 30):  # cycles every 30 s; rows at 0, 300, 600, 900
        store.publish(cycle(second, [gpu()]))
    store.close()  # writes the last cycle, 990, not yet written
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            written = connection.execute(
                sa.text("SELECT covers_seconds FROM gpu_window ORDER BY at")
            ).all()
    finally:
        engine.dispose()
    assert [covers for (covers,) in written] == [WINDOW, 300.0, 300.0, 300.0, 90.0]
    whole = report(store_url, at(0), at(990), views=("gpu",))
    assert whole.gpus[0].hours_by_job_type["training"] == pytest.approx(990 / 3600)


def test_the_rollup_writers_columns_are_the_tables_columns() -> None:
    """The DB-API writer names its columns by the rows it builds; the tables are models.py's."""
    raw = {column.name: None for column in gpu_window.columns} | {
        "at": H,
        "node": "n",
        "gpu": "0",
        "uuid": "u",
        "job_type": "idle",
        "covers_seconds": 30.0,
        "pod": "p",
        "namespace": "ml",
    }
    for table, upserts in (
        (gpu_hour, gpu_rollup_rows(GPU_HOUR, [raw])),
        (gpu_day, gpu_rollup_rows(GPU_DAY, [raw])),
        (gpu_job_day, gpu_rollup_rows(GPU_JOB_DAY, [raw])),
        (pod_hour, pod_rollup_rows([raw], [])),
    ):
        assert set(upserts[0]) == set(table.columns.keys()), table.name


def test_a_store_interval_keeps_each_nodes_own_slots(store_url: str) -> None:
    """One store writing several nodes (as a benchmark or a relay would) writes each node once
    a slot, not only the first node of the slot."""
    store = TableStore(store_url, store_interval_seconds=300.0)
    for second in range(0, 600, 30):
        for node in ("node-a", "node-b"):
            store.publish(dataclasses.replace(cycle(second, [gpu()]), node=node))
    store.close()
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            written = connection.execute(
                sa.text("SELECT node, count(*) FROM gpu_window GROUP BY node ORDER BY node")
            ).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in written] == [("node-a", 3), ("node-b", 3)]  # 0, 300, 570


@pytest.mark.integration
def test_daemons_creating_the_same_partition_together_create_it_once(
    postgres_server: PostgresServer,
) -> None:
    """One daemon is attaching tomorrow's partition when another finds it missing and waits:
    the second must find it once the first commits, not attach it again."""
    url = postgres_server.create_database()
    TableStore(url).close()
    first, second = Database(parse_store_url(url)), Database(parse_store_url(url))
    tomorrow = SCHEMES["gpu_window"].partition(H + timedelta(days=1))
    outcome: list[BaseException | None] = []

    def ensure() -> None:
        try:
            PartitionKeeper().ensure(second, [("gpu_window", H + timedelta(days=1))])
            outcome.append(None)
        except BaseException as error:  # reported below
            outcome.append(error)

    try:
        with first.transaction() as cursor:
            cursor.execute("LOCK TABLE gpu_window IN SHARE UPDATE EXCLUSIVE MODE")
            for statement in tomorrow.create_statements():
                cursor.execute(statement)
            waiter = threading.Thread(target=ensure)
            waiter.start()
            waiter.join(timeout=0.5)
            assert waiter.is_alive(), "the second daemon did not wait for the first"
        waiter.join(timeout=30)
        assert outcome == [None]
        names = {name for (name,) in first.query("SELECT relname FROM pg_class")}
        assert {tomorrow.name, tomorrow.following().name} <= names
    finally:
        first.close()
        second.close()


@pytest.mark.integration
def test_a_month_attached_later_has_the_workload_index(postgres_server: PostgresServer) -> None:
    """Revision 0014's index on the workload's name and bucket is made on the partitioned
    tables; a month the writer attaches afterwards must get it too (waste's GPU counts)."""
    url = postgres_server.create_database()
    TableStore(url).close()
    database = Database(parse_store_url(url))
    later = H + timedelta(days=400)
    try:
        PartitionKeeper().ensure(database, [("gpu_hour", later), ("gpu_day", later)])
        for table, bucket in (("gpu_hour", "hour"), ("gpu_day", "day")):
            partition = SCHEMES[table].partition(later).name
            definitions = [
                definition
                for (definition,) in database.query(
                    "SELECT indexdef FROM pg_indexes WHERE tablename = %(name)s",
                    {"name": partition},
                )
            ]
            assert any(f"(owner_name, {bucket})" in d for d in definitions), definitions
    finally:
        database.close()
