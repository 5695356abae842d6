"""Right-sizing's rollups (rightsize_*, activity_*): on random stores written through the
writer, the quantiles merged from the rollups (raw rows only at the range's edges) equal those
of the raw rows within one 1 % bucket, and the peaks and covered time agree; revisions
0010_rightsize_rollups (per GPU) and 0011_rightsize_per_workload (merged per workload) fill
them from existing rows as the writer would have, and go down and up again. SQLite always;
PostgreSQL with the ``integration`` marker."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profiler_app.reports.rightsize import weighted_quantile, workload_usages
from profiler_app.sinks.store.activity import percent_bucket
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import (
    activity_day,
    activity_hour,
    gpu_window,
    rightsize_day,
    rightsize_hour,
)
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.migrations import migrate
from tests.support.store_rows import write_rows

pytest_plugins = ["tests.support.postgres"]

T0 = datetime(2026, 10, 31, 21, 3, tzinfo=UTC)  # near the end of a day and a month
TABLES = (rightsize_hour, rightsize_day, activity_hour, activity_day)
# (namespace, pod, owner): a job's pod, a bare pod, and a second workload for the same GPUs.
PODS = (("ml", "train-0", "llama"), ("ml", "serve-1", None), ("web", "api-7", "api"))
RATIOS = st.one_of(
    st.none(),
    st.integers(0, 100).map(lambda whole: whole / 100),  # whole percents: exact
    st.floats(0.0, 1.2, allow_nan=False),  # MIG can read above 1
)
GPU = st.tuples(
    st.sampled_from([("0", ""), ("0", "7"), ("1", "")]),  # a whole GPU and a MIG instance
    st.sampled_from(PODS),
    RATIOS,
    RATIOS,
    st.sampled_from([None, 512.0, 30_000.0]),
)
# Per cycle: node, seconds since that node's previous cycle, its GPUs.
CYCLES = st.lists(
    st.tuples(
        st.sampled_from(["node-a", "node-b"]),
        st.one_of(st.sampled_from([0.0, 300.0, 3600.0]), st.floats(1.0, 90_000.0)),
        st.lists(GPU, min_size=1, max_size=3, unique_by=lambda gpu: gpu[0]),
    ),
    min_size=1,
    max_size=30,
)
RANGES = st.lists(
    st.tuples(st.integers(0, 20 * 86_400), st.integers(1, 20 * 86_400)), min_size=1, max_size=3
)
WINDOW = 7200.0


def rows_of(plan: list[Any]) -> list[dict[str, Any]]:
    """Raw rows as the writer makes them: each covering the time since its GPU's previous row,
    at most the window."""
    at = {"node-a": T0, "node-b": T0 + timedelta(seconds=450)}
    last: dict[tuple[str, str, str], datetime] = {}
    rows = []
    for node, gap, gpus in plan:
        at[node] += timedelta(seconds=gap)
        for (gpu, instance), (namespace, pod, owner), sm, dram, fb in gpus:
            key = (node, gpu, instance)
            previous = last.get(key)
            covers = (
                WINDOW if previous is None else min((at[node] - previous).total_seconds(), WINDOW)
            )
            last[key] = at[node]
            rows.append(
                {
                    "at": at[node],
                    "node": node,
                    "gpu": gpu,
                    "uuid": f"GPU-{node}-{gpu}",
                    "gpu_i_id": instance,
                    "mig_profile": "1g.10gb" if instance else None,
                    "gpu_model": "NVIDIA H100 80GB HBM3",
                    "job_type": "training",
                    "period_seconds": 10.0 if sm is not None else None,
                    "window_seconds": WINDOW,
                    "covers_seconds": covers,
                    "util_max": 50.0 if sm is None else sm * 100,
                    "util_idle_fraction": 0.25,
                    "fb_used_max_mib": fb,
                    "namespace": namespace,
                    "pod": pod,
                    "owner_kind": "Job" if owner else None,
                    "owner_name": owner,
                    "sm_active_p95": sm,
                    "sm_active_mean": None if sm is None else sm / 2,
                    "dram_active_p95": dram,
                }
            )
    return rows


def reference(
    connection: sa.Connection, since: datetime, until: datetime
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per workload, from the stored raw rows alone: each row weighted by the microseconds of
    ``(at - covers, at]`` inside ``[since, until)`` (a row covering nothing, where its ``at``
    is, with no weight)."""
    low = (since - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    high = (until - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    found: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: {"w": [], "sm": [], "mean": [], "dram": [], "fb": None, "covered": 0.0}
    )
    for row in connection.execute(sa.select(gpu_window)).mappings():
        end = (row["at"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        covers = round(row["covers_seconds"] * 1e6)
        overlap = min(end, high) - max(end - covers, low)
        if not (overlap > 0 or (covers == 0 and low <= end < high)):
            continue
        usage = found[(row["namespace"], row["owner_name"] or row["pod"])]
        weight = max(overlap, 0) / 1e6
        usage["w"].append(weight)
        for name, column in (("sm", "sm_active_p95"), ("mean", "sm_active_mean")):
            usage[name].append(math.nan if row[column] is None else row[column])
        usage["dram"].append(math.nan if row["dram_active_p95"] is None else row["dram_active_p95"])
        usage["covered"] += weight
        if row["fb_used_max_mib"] is not None:
            usage["fb"] = max(usage["fb"] or 0.0, row["fb_used_max_mib"])
    return found


def close(got: float, raw: float) -> bool:
    """Within one 1 % bucket of the raw quantile, clamped to [0, 1] as right-sizing reads it."""
    return abs(got - min(max(raw, 0.0), 1.0)) <= 0.01 + 1e-9


def near_quantile(got: float, values: list[float], weights: list[float], q: float) -> bool:
    """``got`` is close to the raw ``q`` quantile. Where the cumulative weight reaches exactly
    ``q`` of the total at a value (two rows of equal covered time around a median), the answer
    is that value or the next, and which one depends on the order floats were summed in (the
    rollups add a row's time hour by hour): either counts."""
    answers = {weighted_quantile(values, weights, q + nudge) for nudge in (-1e-9, 0.0, 1e-9)}
    return any(close(got, 0.0 if math.isnan(answer) else answer) for answer in answers)


def check(
    url: str,
    plan: list[Any],
    ranges: list[tuple[int, int]],
    *,
    before: Callable[[str, list[tuple[datetime, datetime]]], None] | None = None,
) -> None:
    """Writes the plan; ``before``, given the URL and the ranges, runs before the check
    (test_store_packing.py packs the store there)."""
    write_rows(url, rows_of(plan))
    first = T0 - timedelta(hours=3)
    periods = [
        (first + timedelta(seconds=start), first + timedelta(seconds=start + length))
        for start, length in ranges
    ]
    if before is not None:
        before(url, periods)
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            for since, until in periods:
                expected = reference(connection, since, until)
                full = workload_usages(connection, since=since, until=until)
                got = {(merged.namespace, merged.workload): usage for merged, usage in full}
                assert set(got) == set(expected), (since, until)
                for merged, _ in full:
                    covered = expected[(merged.namespace, merged.workload)]["covered"]
                    assert merged.covered == pytest.approx(covered, rel=1e-9, abs=1e-6)
                for key, raw in expected.items():
                    assert_usage(got[key], raw, (key, since, until))
                for top in (1, 2):
                    notes: list[str] = []
                    cut = workload_usages(
                        connection, since=since, until=until, top=top, notes=notes
                    )
                    assert_top(cut, full, top, notes)
                    for merged, usage in cut:  # its quantiles as close to the raw rows'
                        key = (merged.namespace, merged.workload)
                        assert_usage(usage, expected[key], (key, since, until, top))
    finally:
        engine.dispose()


def assert_usage(usage: Any, raw: dict[str, Any], what: Any) -> None:
    """A workload's usage against its raw rows' (``reference``)."""
    sm = weighted_quantile(raw["sm"], raw["w"], 0.95)
    if math.isnan(sm):
        assert isinstance(usage, str), what
        return
    assert not isinstance(usage, str), what
    assert near_quantile(usage.sm_active_p95, raw["sm"], raw["w"], 0.95), what
    assert near_quantile(usage.sm_active_p50, raw["mean"], raw["w"], 0.5), what
    assert near_quantile(usage.dram_active_p95, raw["dram"], raw["w"], 0.95), what
    assert usage.peak_fb_mib == (raw["fb"] or 0.0), what
    assert usage.active_fraction == pytest.approx(0.75), what


# A quantile on a tie (the cumulative time reaching it exactly at a bucket's end) is that
# bucket or the next, by the order the SQL added the same seconds in; filtered, the order may
# differ. assert_usage holds them to the raw rows' either way.
QUANTILES = ("sm_active_p95", "sm_active_p50", "dram_active_p95")


def same(a: Any, b: Any) -> bool:
    """Equal but for the quantiles, floats to rounding (filtered, the SQL may add the same rows
    in another order)."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    left, right = asdict(a), asdict(b)
    return left.keys() == right.keys() and all(
        left[key] == pytest.approx(right[key], rel=1e-9, abs=1e-9)
        if isinstance(left[key], float)
        else left[key] == right[key]
        for key in left
        if key not in QUANTILES
    )


def assert_top(cut: list[Any], full: list[Any], top: int, notes: list[str]) -> None:
    """``cut`` holds ``top`` of ``full``'s workloads (all if fewer), advised as ``full`` advises
    them (but for a quantile's tie), in the same order, and none left out has more GPU-hours (a
    tie may go either way)."""
    assert len(cut) == min(top, len(full))
    rows = {(merged.namespace, merged.workload): (merged, usage) for merged, usage in full}
    for merged, usage in cut:
        kept, advice = rows[(merged.namespace, merged.workload)]
        assert merged.covered == pytest.approx(kept.covered, rel=1e-9, abs=1e-9)
        assert same(usage, advice), (merged.workload, usage, advice)
    # In full's order (full is sorted by covered time as it merges; the ranking sums in SQL).
    order = [(merged.namespace, merged.workload) for merged, _ in full]
    listed = [(merged.namespace, merged.workload) for merged, _ in cut]
    assert sorted(listed, key=order.index) == listed or len({m.covered for m, _ in cut}) < len(cut)
    if cut:
        least = min(merged.covered for merged, _ in cut)
        listed = {(merged.namespace, merged.workload) for merged, _ in cut}
        for key, (merged, _) in rows.items():
            if key not in listed:
                assert merged.covered <= least * (1 + 1e-9) + 1e-6, key
    left_out = len(full) - top
    assert notes == (
        [
            f"rightsize advises the {top} workloads with the most GPU-hours; "
            f"--top 0 also advises {left_out}"
        ]
        if left_out > 0
        else []
    )


def test_percent_buckets_keep_whole_percents_whole() -> None:
    assert [percent_bucket(whole / 100) for whole in range(101)] == list(range(101))
    assert (percent_bucket(-0.1), percent_bucket(0.999), percent_bucket(1.3)) == (0, 99, 100)


# Two windows of serve-1 with equal time and means 0.375 and 0: their median is a tie, which
# the filtered (--top) query's sums broke the other way on PostgreSQL.
MEDIAN_TIE = {
    "plan": [
        ("node-b", 346.56566606638404, [(("0", ""), PODS[0], 0.0, 0.73, None)]),
        (
            "node-b",
            9543.333914477422,
            [
                (("1", ""), PODS[1], 0.75, 0.49, None),
                (("0", ""), PODS[0], None, None, None),
                (("0", "7"), PODS[1], 0.0, 0.41, None),
            ],
        ),
        (
            "node-a",
            0.0,
            [(("0", ""), PODS[0], 0.62, 0.34, None), (("0", "7"), PODS[2], 0.0, None, None)],
        ),
    ],
    "ranges": [(0, 168407)],
}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=CYCLES, ranges=RANGES)
@example(**MEDIAN_TIE)
def test_rollup_quantiles_match_the_raw_rows_on_sqlite(
    tmp_path_factory: pytest.TempPathFactory, plan: list[Any], ranges: list[tuple[int, int]]
) -> None:
    path = tmp_path_factory.mktemp("store") / "profiler.db"
    check(f"sqlite:///{path}", plan, ranges)


@pytest.mark.integration
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=CYCLES, ranges=RANGES)
@example(**MEDIAN_TIE)
def test_rollup_quantiles_match_the_raw_rows_on_postgresql(
    postgres_server: Any, plan: list[Any], ranges: list[tuple[int, int]]
) -> None:
    check(postgres_server.create_database(), plan, ranges)


def snapshot(connection: sa.Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Each table's rows, sorted, with floats rounded (sums add up in another order in SQL)."""
    tables = {}
    for table in TABLES:
        rows = [
            tuple(round(value, 6) if isinstance(value, float) else value for value in row)
            for row in connection.execute(sa.select(table))
        ]
        tables[table.name] = sorted(rows, key=repr)
    return tables


def test_the_migration_fills_the_rollups_as_the_writer_does_and_goes_down_and_up(
    store_url: str,
) -> None:
    plan = [
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
        ("node-a", 0.0, [(("0", ""), PODS[2], 0.7, 0.2, 512.0)]),  # covers nothing
        # Across midnight, stamped in a second's last half-millisecond (strftime rounds it up).
        ("node-a", 85_999.9997, [(("0", ""), PODS[2], 0.123456, 0.9, 512.0)]),
        ("node-b", 5_000.0, [(("1", ""), PODS[0], 0.5, 0.5, None)]),
    ]
    write_rows(store_url, rows_of(plan))
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            written = snapshot(connection)
        assert all(written.values()), "the writer filled every table"
        migrate(engine, "0009_gpu_identity", down=True)
        with engine.connect() as connection:
            names = set(sa.inspect(connection).get_table_names())
            assert not names & {table.name for table in TABLES}
            assert connection.execute(sa.select(sa.func.count()).select_from(gpu_window)).scalar()
        migrate(engine, "head")
        with engine.connect() as connection:
            assert snapshot(connection) == written
        migrate(engine, "0009_gpu_identity", down=True)
        migrate(engine, "head")
        with engine.connect() as connection:
            assert snapshot(connection) == written
        # Down to the per-GPU tables (filled from the raw rows), then merged per workload.
        migrate(engine, "0010_rightsize_rollups", down=True)
        with engine.connect() as connection:
            columns = {
                column["name"] for column in sa.inspect(connection).get_columns("activity_day")
            }
            assert {"node", "gpu", "uuid"} <= columns
            per_gpu = connection.execute(sa.text("SELECT count(*) FROM activity_day")).scalar()
        migrate(engine, "head")
        with engine.connect() as connection:
            merged = connection.execute(sa.select(sa.func.count()).select_from(activity_day))
            assert merged.scalar() < per_gpu, "a workload's GPUs merged into one row"
            assert snapshot(connection) == written
    finally:
        engine.dispose()
