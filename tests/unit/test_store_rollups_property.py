"""The report from rollups equals the report from raw rows, on random stores (hypothesis).

Random cycles (nodes, GPUs, gaps shorter and longer than the window, repeated times, job types,
pods, workloads, memory held or not, idle fractions, periods) go through the real ``TableStore``
into a real store; then, for random ranges with microsecond edges, ``build_report`` reading
rollups for whole days and hours (raw rows only at the edges) must give what it gives from raw
rows alone, and both what a plain Python sum over the stored rows gives, to rounding; and
waste's ranking must list the same groups once the idle blocks of the days are made. SQLite
always; PostgreSQL with the ``integration`` marker.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profiler_app.core.model import FB_USED, GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.reports.gpus import JOB_TYPES as KNOWN_JOB_TYPES
from profiler_app.reports.gpus import OTHER_JOB_TYPE
from profiler_app.reports.history import build_report, report_rows
from profiler_app.reports.waste import WASTE_KINDS
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.idle_blocks import IdleBlocks
from profiler_app.sinks.store.models import gpu_window
from profiler_app.sinks.store.rollups import covers_microseconds, memory_held, microseconds
from profiler_app.sinks.store.urls import parse_store_url

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]

T0 = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)
JOB_TYPES = ("idle", "training", "inference", "bursty", "waiting-for-data")  # one unknown type
PODS = (None, ("ml", "train-0", "PyTorchJob", "llama"), ("ml", "serve-1", None, None))
GAPS = st.one_of(
    st.sampled_from([0.0, 30.0, 60.0, 1799.0, 1800.0, 3600.0, 5400.0, 86400.0]),
    st.integers(1, 200_000_000_000).map(lambda us: us / 1e6),  # up to ~2 days, microseconds
)

# An idle fraction is a share of a window's samples (k of n), as the classifier computes it: never
# a subnormal float, whose products PostgreSQL refuses as an underflow.
IDLE_FRACTIONS = st.builds(
    lambda samples, idle: min(idle, samples) / samples,
    st.integers(1, 100_000),
    st.integers(0, 100_000),
)


@dataclass(frozen=True)
class Gpu:
    job_type: str
    util_max: float
    idle_fraction: float | None
    fb_used: float | None
    pod: tuple[str, str, str | None, str | None] | None
    period: float | None


GPUS = st.builds(
    Gpu,
    st.sampled_from(JOB_TYPES),
    st.integers(0, 100).map(float),
    st.one_of(st.none(), IDLE_FRACTIONS),
    st.sampled_from([None, 100.0, 1024.0, 40_000.0]),
    st.sampled_from(PODS),
    st.one_of(st.none(), st.floats(0.5, 600.0)),
)
# Per cycle: the node, the gap since that node's previous cycle, and each of its GPUs (1-3).
CYCLES = st.lists(
    st.tuples(st.sampled_from(["node-a", "node-b"]), GAPS, st.lists(GPUS, min_size=1, max_size=3)),
    min_size=1,
    max_size=40,
)
TINY = 1e-9  # hours: float noise where a sum is zero (3.6 microseconds)
WINDOWS = st.sampled_from([1800.0, 7200.0, 100_000.0])
# A range: start and length in microseconds from T0 - 2 h (the stores span up to ~80 days),
# anywhere or on whole minutes (rows' and buckets' edges).
MICROSECONDS = st.one_of(
    st.integers(0, 90 * 86_400_000_000), st.integers(0, 90 * 1440).map(lambda m: m * 60_000_000)
)
RANGES = st.lists(st.tuples(MICROSECONDS, MICROSECONDS), min_size=1, max_size=4)


def cycles_of(plan: list[Any], window: float) -> list[CycleResult]:
    at = {"node-a": T0, "node-b": T0 + timedelta(minutes=7)}
    results = []
    for node, gap, gpus in plan:
        at[node] += timedelta(seconds=gap)
        profiles = []
        for index, gpu in enumerate(gpus):
            idle = float("nan") if gpu.idle_fraction is None else gpu.idle_fraction
            stats = {GPU_UTIL: FieldStats(gpu.util_max, p95=1.0, mean=1.0, idle_fraction=idle)}
            if gpu.fb_used is not None:
                stats[FB_USED] = FieldStats(gpu.fb_used, gpu.fb_used, gpu.fb_used, 0.0)
            namespace, pod, owner_kind, owner_name = gpu.pod or (None, None, None, None)
            profiles.append(
                GpuProfile(
                    str(index),
                    f"GPU-{node}-{index}",
                    node,
                    gpu.job_type,
                    gpu.period,
                    stats,
                    namespace=namespace,
                    pod=pod,
                    owner_kind=owner_kind,
                    owner_name=owner_name,
                )
            )
        results.append(CycleResult(node, at[node], window, profiles))
    return results


def reference(connection: sa.Connection, since: datetime, until: datetime) -> dict[str, Any]:
    """The GPU and waste views summed in Python over the stored rows: each row counts for its
    covered time ``(at - covers, at]`` inside ``[since, until)``, in whole microseconds."""
    low, high = microseconds(since), microseconds(until)
    hours: dict[tuple[str, str, str], float] = defaultdict(float)
    idle: dict[tuple[str, str], float] = defaultdict(float)
    peaks: dict[tuple[str, str], float | None] = {}
    waste_gpus: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    waste_hours: dict[tuple[Any, ...], float] = defaultdict(float)
    for row in connection.execute(sa.select(gpu_window)).mappings():
        end = microseconds(row["at"])
        covers = covers_microseconds(row["covers_seconds"])
        overlap = min(end, high) - max(end - covers, low)
        if not (overlap > 0 or (covers == 0 and low <= end < high)):
            continue
        seconds = max(overlap, 0) / 1e6
        gpu = (row["node"], row["gpu"])
        # The views show a job type the report does not know as other_hours.
        job_type = row["job_type"] if row["job_type"] in KNOWN_JOB_TYPES else OTHER_JOB_TYPE
        hours[(*gpu, job_type)] += seconds / 3600
        idle_hours = seconds * (row["util_idle_fraction"] or 0.0) / 3600
        idle[gpu] += idle_hours
        util, peak = row["util_max"], peaks.get(gpu)
        peaks[gpu] = peak if util is None else util if peak is None else max(peak, util)
        kind = (
            WASTE_KINDS[1]
            if memory_held(row["fb_used_max_mib"])
            else WASTE_KINDS[2]
            if row["pod"]
            else WASTE_KINDS[0]
        )
        key = (kind, row["namespace"], row["owner_kind"], row["owner_name"])
        if idle_hours > 0:  # a GPU counts in a waste row when it added idle time to it
            waste_gpus[key].add(f"{row['node']}/{row['uuid']}")
        waste_hours[key] += idle_hours
    return {
        "hours": dict(hours),
        "idle": dict(idle),
        "peaks": peaks,
        "waste": {key: (len(waste_gpus[key]), waste_hours[key]) for key in waste_hours},
    }


def summary(report: Any) -> dict[str, Any]:
    hours = {
        (gpu.node, gpu.gpu, job_type): value
        for gpu in report.gpus
        for job_type, value in gpu.hours_by_job_type.items()
        if value > TINY
    }
    return {
        "hours": hours,
        "idle": {(gpu.node, gpu.gpu): gpu.idle_gpu_hours for gpu in report.gpus},
        "peaks": {(gpu.node, gpu.gpu): gpu.util_max_percent for gpu in report.gpus},
        "waste": {
            (w.kind, w.namespace, w.owner_kind, w.owner_name): (w.gpus, w.idle_gpu_hours)
            for w in report.waste
            if w.idle_gpu_hours > TINY
        },
    }


def assert_same(got: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    hours = {key: value for key, value in expected["hours"].items() if value > TINY}
    assert got["hours"] == pytest.approx(hours, rel=1e-9, abs=1e-9), what
    assert got["idle"] == pytest.approx(expected["idle"], rel=1e-9, abs=1e-9), what
    assert got["peaks"] == expected["peaks"], what
    waste = {key: value for key, value in expected["waste"].items() if value[1] > TINY}
    assert set(got["waste"]) == set(waste), what
    for key, (gpus, idle_hours) in waste.items():
        assert got["waste"][key][0] == gpus, (what, key)
        assert got["waste"][key][1] == pytest.approx(idle_hours, rel=1e-9, abs=1e-9), (what, key)


def assert_same_rows(got: list[dict[str, Any]], expected: list[dict[str, Any]], what: str) -> None:
    """The same rows in the same order; sums to rounding (they may add in another order)."""
    assert [list(row.items())[:2] for row in got] == [list(row.items())[:2] for row in expected], (
        what
    )
    for row, want in zip(got, expected, strict=True):
        floats = {key for key, value in want.items() if isinstance(value, float)}
        assert {key: row[key] for key in row if key not in floats} == {
            key: want[key] for key in want if key not in floats
        }, (what, row["node"])
        assert {key: row[key] for key in floats} == pytest.approx(
            {key: want[key] for key in floats}, rel=1e-9, abs=1e-9
        ), (what, row["node"])


def assert_top(cut: list[Any], full: list[Any], top: int, what: str) -> None:
    """``cut`` holds, per kind, ``top`` of ``full``'s groups (all if fewer) as ``full`` has them,
    and none it left out idled more (a tie may go either way: the ranking sums in another order).
    """

    def key(w: Any) -> tuple[Any, ...]:
        return (w.kind, w.namespace, w.owner_kind, w.owner_name)

    rows = {key(w): w for w in full}
    for kind in {w.kind for w in full}:
        kept = {key(w): w for w in cut if w.kind == kind}
        assert len(kept) == min(top, sum(w.kind == kind for w in full)), what
        for group, w in kept.items():  # sums to rounding: filtered, they may add in another order
            assert w.gpus == rows[group].gpus, what
            assert w.idle_gpu_hours == pytest.approx(rows[group].idle_gpu_hours, rel=1e-9), what
        least = min(w.idle_gpu_hours for w in kept.values())
        for w in full:
            if w.kind == kind and key(w) not in kept:
                assert w.idle_gpu_hours <= least * (1 + 1e-9) + 1e-12, what
    assert {w.kind for w in cut} == {w.kind for w in full}, what


def assert_tops(
    connection: sa.Connection, since: datetime, until: datetime, full: list[Any], what: str
) -> None:
    """``--top 1`` and ``--top 2`` list groups of ``full`` as ``assert_top`` wants them."""
    for top in (1, 2):
        cut = build_report(connection, since=since, until=until, views=("waste",), top=top)
        assert_top(cut.waste, full, top, f"--top {top}, {what}")


def check_store(url: str, plan: list[Any], window: float, ranges: list[tuple[int, int]]) -> None:
    store = TableStore(url)
    try:
        for result in cycles_of(plan, window):
            store.publish(result)
    finally:
        store.close()
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            for start, length in ranges:
                since = T0 - timedelta(hours=2) + timedelta(microseconds=start)
                until = since + timedelta(microseconds=length)
                views = ("node", "gpu", "waste")  # the nodes added up from the GPUs
                rolled = build_report(connection, since=since, until=until, views=views)
                raw = build_report(connection, since=since, until=until, views=views, rollups=False)
                expected = reference(connection, since, until)
                what = f"{since.isoformat()} .. {until.isoformat()}"
                assert_same(summary(raw), expected, f"raw rows, {what}")
                assert_same(summary(rolled), expected, f"rollups, {what}")
                # The node view alone sums in SQL what it adds up from the GPUs with the GPU view.
                alone = build_report(connection, since=since, until=until, views=("node",))
                assert_same_rows(report_rows(alone, "node"), report_rows(rolled, "node"), what)
                assert_tops(connection, since, until, rolled.waste, what)
        # Idle blocks made of every settled day: waste ranks from them, the same groups.
        database = Database(parse_store_url(url))
        try:
            IdleBlocks(every=0.0, limit=10_000).make(database, T0 + timedelta(days=200))
        finally:
            database.close()
        with engine.connect() as connection:
            for start, length in ranges:
                since = T0 - timedelta(hours=2) + timedelta(microseconds=start)
                until = since + timedelta(microseconds=length)
                full = build_report(connection, since=since, until=until, views=("waste",))
                what = f"idle blocks, {since.isoformat()} .. {until.isoformat()}"
                assert_tops(connection, since, until, full.waste, what)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty store at the newest schema, copied for each example (migrating takes longer)."""
    path = tmp_path_factory.mktemp("template") / "profiler.db"
    TableStore(f"sqlite:///{path}").close()
    return path


# A row stamped in the last half-millisecond of a second: SQLite's strftime('%s') rounds it up.
LATE_IN_A_SECOND = {
    "plan": [
        ("node-a", 0.0, [Gpu("idle", 0.0, None, None, None, None)]),
        ("node-a", 199_999.999999, [Gpu("idle", 0.0, None, None, None, None)]),
    ],
    "ranges": [(45 * 3600 * 1_000_000 + 600_000_000, 12 * 3600 * 1_000_000 + 1_920_000_000)],
}


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=CYCLES, window=WINDOWS, ranges=RANGES)
@example(window=7200.0, **LATE_IN_A_SECOND)
@example(window=100_000.0, **LATE_IN_A_SECOND)
def test_rollups_and_raw_rows_give_the_same_report_on_sqlite(
    sqlite_template: Path, plan: list[Any], window: float, ranges: list[tuple[int, int]]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profiler.db"
        shutil.copy(sqlite_template, path)
        check_store(f"sqlite:///{path}", plan, window, ranges)


@pytest.fixture(scope="module")
def postgresql_store(postgres_server: PostgresServer) -> str:
    url = postgres_server.create_database()
    TableStore(url).close()
    return url


@pytest.mark.integration
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=CYCLES, window=WINDOWS, ranges=RANGES)
def test_rollups_and_raw_rows_give_the_same_report_on_postgresql(
    postgresql_store: str, plan: list[Any], window: float, ranges: list[tuple[int, int]]
) -> None:
    engine = create_store_engine(parse_store_url(postgresql_store), create_file=False)
    try:
        with engine.begin() as connection:
            tables = "gpu_window, gpu_hour, gpu_day, gpu_job_day, pod_hour"
            tables += ", idle_block, idle_block_gpu, idle_block_made"
            connection.execute(sa.text(f"TRUNCATE {tables}"))
    finally:
        engine.dispose()
    check_store(postgresql_store, plan, window, ranges)
