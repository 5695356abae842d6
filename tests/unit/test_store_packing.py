"""Packed histograms (sinks/store/packing.py, revision 0012_packed_histograms): packing is
lossless (the rightsize advice is the same before and after, and the rollups' quantiles still
match the raw rows'), a late write for a packed bucket counts once, a writer upserting while
PostgreSQL packs loses and doubles nothing, and going down to 0011 unpacks every row. SQLite
always; PostgreSQL with the ``integration`` marker."""

from __future__ import annotations

import json
import math
import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profiler_app.core.model import GPU_UTIL, SM_ACTIVE, CycleResult, FieldStats, GpuProfile
from profiler_app.reports.histograms import quantiles
from profiler_app.reports.history import build_report, report_rows
from profiler_app.reports.rightsize import histogram_quantile, rightsize_advice
from profiler_app.reports.rightsizing.output import advice_record
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.activity import ACTIVITY_HOUR, activity_statement
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import (
    activity_day,
    activity_day_packed,
    activity_hour,
    activity_hour_packed,
    gpu_window,
)
from profiler_app.sinks.store.packing import METRIC_ORDER, RECORD_FIELDS, Packing
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.migrations import migrate
from tests.support.store_rows import write_rows
from tests.unit.test_store_rightsize_rollups import (
    CYCLES,
    PODS,
    RANGES,
    T0,
    check,
    rows_of,
    snapshot,
)

pytest_plugins = ["tests.support.postgres"]

LATER = datetime(2027, 1, 1, tzinfo=UTC)  # every bucket of the plans is complete by then
HISTOGRAM = st.lists(
    st.one_of(st.just(0.0), st.floats(0.0, 1e6, allow_nan=False), st.integers(0, 3600)),
    min_size=101,
    max_size=101,
)
PAIRS = ((activity_hour, activity_hour_packed), (activity_day, activity_day_packed))


@settings(max_examples=200, deadline=None)
@given(histograms=st.lists(HISTOGRAM, min_size=1, max_size=5), q=st.sampled_from([0.5, 0.95]))
# Found by Hypothesis: half the total underflows to 0, which an empty first bucket reaches.
@example(histograms=[[0.0] * 100 + [5e-324]], q=0.5)
def test_vectorised_quantiles_are_histogram_quantile(
    histograms: list[list[float]], q: float
) -> None:
    got = quantiles(np.array(histograms, dtype=np.float64), q).tolist()
    expected = [histogram_quantile([float(v) for v in row], q) for row in histograms]
    assert [None if math.isnan(v) else v for v in got] == [
        None if math.isnan(v) else v for v in expected
    ]


def pack(url: str, *, batch_rows: int = 7) -> int:
    """Packs every complete bucket with the writer's own packing, in small batches."""
    database = Database(parse_store_url(url))
    try:
        return Packing(batch_rows=batch_rows, max_batches=10**6, every=0).pack(database, LATER)
    finally:
        database.close()


def advice_json(
    url: str, periods: list[tuple[datetime, datetime]], top: int | None = None
) -> list[str]:
    """The advice over each period (``top``: its workloads with the most GPU-hours, whose
    histograms are read by name)."""
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return [
                json.dumps(
                    [
                        advice_record(a)
                        for a in rightsize_advice(connection, since=since, until=until, top=top)
                    ],
                    sort_keys=True,
                )
                for since, until in periods
            ]
    finally:
        engine.dispose()


def counts(url: str) -> dict[str, int]:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return {
                table.name: connection.execute(
                    sa.select(sa.func.count()).select_from(table)
                ).scalar_one()
                for pair in PAIRS
                for table in pair
            }
    finally:
        engine.dispose()


def histogram_totals(url: str) -> dict[tuple[Any, ...], float]:
    """Per (table, bucket, namespace, workload, metric, percent): the seconds of the row-form
    rows and the packed records together."""
    totals: dict[tuple[Any, ...], float] = defaultdict(float)
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            for rows, packed in PAIRS:
                column = "hour" if "hour" in rows.c else "day"
                for moment, ns, workload, metric, percent, seconds in connection.execute(
                    sa.select(rows)
                ):
                    totals[(rows.name, moment, ns, workload, metric, percent)] += seconds
                for moment, ns, workload, blob in connection.execute(
                    sa.select(
                        packed.c[column], packed.c.namespace, packed.c.workload, packed.c.histograms
                    )
                ):
                    for cell, seconds in np.frombuffer(blob, RECORD_FIELDS).tolist():
                        metric, percent = METRIC_ORDER[cell // 101], cell % 101
                        totals[(rows.name, moment, ns, workload, metric, percent)] += seconds
    finally:
        engine.dispose()
    return dict(totals)


def packed_losslessly(url: str, periods: list[tuple[datetime, datetime]]) -> None:
    """``check``'s step before its comparison with the raw rows: the same advice after
    packing as before, every histogram row packed."""
    before = advice_json(url, periods)
    totals = histogram_totals(url)
    unpacked = counts(url)
    assert pack(url) == unpacked["activity_hour"] + unpacked["activity_day"]
    found = counts(url)
    assert found["activity_hour"] == found["activity_day"] == 0
    assert advice_json(url, periods) == before
    assert histogram_totals(url) == pytest.approx(totals)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=CYCLES, ranges=RANGES)
def test_packing_keeps_the_advice_and_the_quantiles_on_sqlite(
    tmp_path_factory: pytest.TempPathFactory, plan: list[Any], ranges: list[tuple[int, int]]
) -> None:
    path = tmp_path_factory.mktemp("store") / "profiler.db"
    check(f"sqlite:///{path}", plan, ranges, before=packed_losslessly)


@pytest.mark.integration
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=CYCLES, ranges=RANGES)
def test_packing_keeps_the_advice_and_the_quantiles_on_postgresql(
    postgres_server: Any, plan: list[Any], ranges: list[tuple[int, int]]
) -> None:
    check(postgres_server.create_database(), plan, ranges, before=packed_losslessly)


PLAN = [
    (
        "node-a",
        0.0,
        [(("0", ""), PODS[0], 0.29, 0.5, 512.0), (("0", "7"), PODS[1], 1.1, None, None)],
    ),
    (
        "node-a",
        300.0,
        [(("0", ""), PODS[0], 0.2, 0.51, 30_000.0), (("0", "7"), PODS[1], 0.3, 0.1, 512.0)],
    ),
    ("node-b", 0.0, [(("1", ""), PODS[2], None, None, 512.0)]),
    ("node-a", 86_000.0, [(("0", ""), PODS[2], 0.123456, 0.9, 512.0)]),  # across midnight
    ("node-b", 5_000.0, [(("1", ""), PODS[0], 0.5, 0.5, None)]),
]
PERIODS = [
    (T0 - timedelta(days=1), T0 + timedelta(days=3)),
    (T0 + timedelta(hours=1), T0 + timedelta(hours=30)),
]


def test_a_late_write_for_a_packed_bucket_counts_once(store_url: str, tmp_path: Any) -> None:
    reference = f"sqlite:///{tmp_path / 'reference.db'}"
    rows = rows_of(PLAN)
    late = [
        {
            **rows[0],
            "at": rows[0]["at"] + timedelta(seconds=120),
            "covers_seconds": 120.0,
            "sm_active_p95": 0.77,
        }
    ]
    write_rows(store_url, rows)
    write_rows(reference, rows + late)
    assert pack(store_url) > 0
    write_rows(store_url, late)  # after its buckets were packed: row form again
    found = counts(store_url)
    assert found["activity_hour"]
    assert found["activity_day"]
    assert histogram_totals(store_url) == pytest.approx(histogram_totals(reference))
    assert advice_json(store_url, PERIODS) == advice_json(reference, PERIODS)
    pack(store_url)  # packed again: a second packed row for those buckets
    assert counts(store_url)["activity_hour"] == 0
    assert histogram_totals(store_url) == pytest.approx(histogram_totals(reference))
    assert advice_json(store_url, PERIODS) == advice_json(reference, PERIODS)


def test_going_down_to_0011_unpacks_every_row(store_url: str) -> None:
    write_rows(store_url, rows_of(PLAN))
    advice = advice_json(store_url, PERIODS)
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            written = snapshot(connection)
        assert pack(store_url) > 0
        migrate(engine, "0011_rightsize_per_workload", down=True)
        with engine.connect() as connection:
            assert not {"activity_hour_packed", "activity_day_packed"} & set(
                sa.inspect(connection).get_table_names()
            )
            assert snapshot(connection) == written
        migrate(engine, "head")
        assert advice_json(store_url, PERIODS) == advice
        pack(store_url)
        assert advice_json(store_url, PERIODS) == advice
        migrate(engine, "0011_rightsize_per_workload", down=True)
        with engine.connect() as connection:
            assert snapshot(connection) == written
        migrate(engine, "head")
    finally:
        engine.dispose()


def test_0017_and_0018_down_and_up_keep_the_reports_on_old_and_new_rows(store_url: str) -> None:
    """Rows written and packed: the advice (every workload, and the top one, read through the
    workload's index of 0018) and the gpu, node and waste views (the buckets' BRIN of 0017 on
    PostgreSQL). Down to 0016 (the indexes go) and up again: the same figures; then rows
    written a week later and packed give the advice they gave before packing, and views equal
    to the raw rows'."""
    write_rows(store_url, rows_of(PLAN))
    assert pack(store_url) > 0
    old = [*PERIODS, (T0, T0 + timedelta(days=2))]
    figures = {top: advice_json(store_url, old, top) for top in (None, 1)}
    views = [views_of(store_url, since, until) for since, until in old]
    assert views == [views_of(store_url, s, u, rollups=False) for s, u in old]
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        migrate(engine, "0016_idle_block_gpus", down=True)
        assert indexes_on_buckets(engine) == set()
        assert {top: advice_json(store_url, old, top) for top in (None, 1)} == figures
        assert [views_of(store_url, since, until) for since, until in old] == views
        migrate(engine, "head")
        expected = {"activity_hour_packed", "activity_day_packed"}
        if engine.dialect.name == "postgresql":
            expected |= {"gpu_hour", "gpu_day"}
        assert indexes_on_buckets(engine) == expected
        assert {top: advice_json(store_url, old, top) for top in (None, 1)} == figures
        assert [views_of(store_url, since, until) for since, until in old] == views
    finally:
        engine.dispose()

    week = timedelta(days=7)
    write_rows(store_url, [{**row, "at": row["at"] + week} for row in rows_of(PLAN)])
    new = [(since + week, until + week) for since, until in old]
    unpacked = {top: advice_json(store_url, new, top) for top in (None, 1)}
    assert pack(store_url) > 0
    assert {top: advice_json(store_url, new, top) for top in (None, 1)} == unpacked
    assert unpacked == figures  # the same rows a week later: the same advice
    assert [views_of(store_url, since, until) for since, until in new] == [
        views_of(store_url, since, until, rollups=False) for since, until in new
    ]


def views_of(url: str, since: datetime, until: datetime, **options: Any) -> list[Any]:
    """The gpu, node and waste views' rows, their floats to 9 significant digits (the raw rows
    and the rollups sum in another order)."""
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            found = build_report(
                connection, since=since, until=until, views=VIEWS, top=1, **options
            )
    finally:
        engine.dispose()
    return [
        [
            {k: float(f"{v:.9g}") if isinstance(v, float) else v for k, v in row.items()}
            for row in report_rows(found, view)
        ]
        for view in VIEWS
    ]


VIEWS = ("gpu", "node", "waste")


def indexes_on_buckets(engine: sa.Engine) -> set[str]:
    """The tables with 0017's or 0018's index: on the bucket alone, BRIN, or the workload's
    name and the bucket."""
    inspector = sa.inspect(engine)
    found = set()
    for table in ("gpu_hour", "gpu_day", "activity_hour_packed", "activity_day_packed"):
        for index in inspector.get_indexes(table):
            using = index.get("dialect_options", {}).get("postgresql_using")
            columns = index["column_names"]
            if using == "brin" or (columns[0] == "workload" and len(columns) == 2):
                found.add(table)
    return found


@pytest.mark.integration
def test_a_writer_upserting_while_postgresql_packs_loses_and_doubles_nothing(
    postgres_server: Any,
) -> None:
    """Two connections on a real server: cycles upsert histogram rows of complete buckets
    while packing deletes and packs them, batch after batch."""
    url, reference = postgres_server.create_database(), postgres_server.create_database()
    rng = np.random.default_rng(7)
    plan = [
        (
            str(rng.choice(["node-a", "node-b"])),
            float(rng.choice([60.0, 300.0, 900.0])),
            [
                (("0", ""), PODS[int(rng.integers(3))], float(rng.integers(101)) / 100, 0.5, 512.0),
                (("1", ""), PODS[int(rng.integers(3))], float(rng.random()), None, None),
            ],
        )
        for _ in range(150)
    ]
    rows = rows_of(plan)
    write_rows(reference, rows)
    write_rows(url, rows[:40])
    done = threading.Event()
    packed: list[int] = []
    errors: list[BaseException] = []

    def packing() -> None:
        try:
            while not done.is_set():
                packed.append(pack(url, batch_rows=5))
        except BaseException as error:  # reported below
            errors.append(error)

    packer = threading.Thread(target=packing)
    packer.start()
    try:
        write_rows(url, rows[40:])
    finally:
        done.set()
        packer.join()
    assert not errors
    assert sum(packed) > 0
    pack(url)
    assert histogram_totals(url) == pytest.approx(histogram_totals(reference))


def test_packing_never_waits_for_a_row_a_cycle_holds(postgres_server: Any) -> None:
    """A cycle upserts the first histogram row in key order, packing starts, then the cycle
    upserts the last row, with the writer's own statement, in one transaction. A DELETE that
    waited for the first row while holding others (the heap's order) deadlocked with the cycle,
    and PostgreSQL's detector failed one of them. The first row is moved to the heap's end so
    that the heap's order and the key's differ."""
    url = postgres_server.create_database()
    write_rows(
        url,
        rows_of(
            [("node-a", 300.0, [(("0", ""), PODS[i % 3], 0.4, 0.5, 512.0)]) for i in range(12)]
        ),
    )
    key = ["hour", "namespace", "workload", "metric", "percent"]
    database = Database(parse_store_url(url))
    upsert = activity_statement(database, ACTIVITY_HOUR, [*key, "seconds"])
    errors: list[BaseException] = []
    packed: list[int] = []

    def packing() -> None:
        try:
            packed.append(pack(url, batch_rows=10**6))
        except BaseException as error:  # reported below
            errors.append(error)

    packer = threading.Thread(target=packing)
    try:
        with database.transaction() as cursor:
            cursor.execute(f"SELECT {', '.join(key)} FROM activity_hour ORDER BY {', '.join(key)}")
            ordered = [dict(zip(key, row, strict=True)) for row in cursor.fetchall()]
            cursor.execute("SELECT count(*) FROM activity_day")
            (day_rows,) = cursor.fetchone()
            cursor.execute(  # a new tuple, after the others in the heap
                "UPDATE activity_hour SET seconds = seconds"
                " WHERE (hour, namespace, workload, metric, percent) = (%(hour)s, %(namespace)s,"
                " %(workload)s, %(metric)s, %(percent)s)",
                ordered[0],
            )
        assert len(ordered) > 2
        first, last = ordered[0], ordered[-1]
        expected = histogram_totals(url)
        for row in (first, last):
            expected[("activity_hour", *row.values())] += 1.0
        with database.transaction() as cycle:
            cycle.execute(upsert, database.bind({**first, "seconds": 1.0}))
            packer.start()
            packer.join(timeout=10)  # waiting for the first row, it would not end
            cycle.execute(upsert, database.bind({**last, "seconds": 1.0}))
    finally:
        if packer.ident is not None:
            packer.join()
        database.close()
    assert not errors
    assert packed == [len(ordered) - 1 + day_rows]  # all but the row the cycle held
    assert histogram_totals(url) == pytest.approx(expected)


def busy_cycle(at: datetime) -> CycleResult:
    """One GPU of a pod with SM activity: a cycle that writes histogram rows."""
    stats = {
        GPU_UTIL: FieldStats(max=90.0, p95=80.0, mean=60.0, idle_fraction=0.1),
        SM_ACTIVE: FieldStats(max=0.7, p95=0.6, mean=0.4, idle_fraction=0.1),
    }
    profile = GpuProfile("0", "GPU-0", "node-a", "training", None, stats, namespace="ml", pod="p")
    return CycleResult("node-a", at, 1800.0, [profile], [])


def test_the_writer_packs_complete_buckets_and_outlives_a_failed_packing(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = TableStore(store_url)
    clock = [0.0]
    store._packing = Packing(every=900.0, clock=lambda: clock[0])
    try:
        store.publish(busy_cycle(T0))
        assert counts(store_url)["activity_hour_packed"] == 0  # not due yet
        clock[0] = 1000.0
        # Covering 23:33-00:03: the first cycle's hours (20:33-21:03) ended an hour before.
        store.publish(busy_cycle(T0 + timedelta(hours=3)))
        assert counts(store_url)["activity_hour_packed"] == 2
        assert counts(store_url)["activity_hour"] == 4  # 23:00 and 00:00, x sm and sm_mean
        clock[0] = 2000.0

        def broken(database: Database, now: datetime) -> int:
            raise database.errors[0]("the store went away")

        monkeypatch.setattr(store._packing, "pack", broken)
        store.publish(busy_cycle(T0 + timedelta(hours=4)))  # written all the same
        assert "packing failed, retrying next cycle" in caplog.text
    finally:
        store.close()
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.select(sa.func.count()).select_from(gpu_window))
            assert rows.scalar_one() == 3
    finally:
        engine.dispose()
