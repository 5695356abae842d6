"""Revision 0007_rollups on a store written before it: up, down and up again, on SQLite and a
real PostgreSQL (``integration``). The rollups the migration's SQL builds from the existing rows
must be those the writer's Python (``rollups.py``) would have built; the rows survive both ways;
on PostgreSQL ``gpu_window`` becomes partitioned by day and back."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from profiler_app.reports.history import build_report
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import alembic_config, create_store_engine
from profiler_app.sinks.store.models import gpu_day, gpu_hour, gpu_job_day, gpu_window, pod_hour
from profiler_app.sinks.store.rollups import (
    GPU_DAY,
    GPU_HOUR,
    GPU_JOB_DAY,
    GPU_VALUES,
    POD_KEY,
    POD_VALUES,
    Tier,
    gpu_rollup_rows,
    pod_rollup_rows,
)
from profiler_app.sinks.store.statements import Merge
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.cycles import AT, sample_cycle
from tests.support.migrations import migrate

pytest_plugins = ["tests.support.postgres"]

T0 = datetime(2026, 10, 31, 22, 50, tzinfo=UTC)  # the end of a month and of a day
BEFORE = "0006"


def old_rows() -> list[dict[str, Any]]:
    """Rows as revision 0003's writer stored them: two GPUs every 5 minutes across midnight,
    a row covering two hours, one covering nothing, one stamped late in a second, pods coming
    and going."""
    rows = []
    for step in range(30):
        for gpu in ("0", "1"):
            at = T0 + timedelta(minutes=5 * step, seconds=7 * int(gpu))
            if step == 2 and gpu == "0":  # midnight's row, late in its second: strftime rounds up
                at += timedelta(microseconds=999_700)
            pod = None if step % 7 == 3 else f"train-{gpu}"
            rows.append(
                {
                    "at": at,
                    "node": "node-a",
                    "gpu": gpu,
                    "uuid": f"GPU-{gpu}",
                    "job_type": ("training", "idle", "bursty")[step % 3],
                    "period_seconds": 11.5 if step % 3 == 0 else None,
                    "window_seconds": 7200.0,
                    "covers_seconds": 7200.0 if step == 0 else 0.0 if step == 9 else 300.0,
                    "util_max": float(step),
                    "util_idle_fraction": None if step == 5 else step / 30,
                    "mem_copy_util_max": 1.5 * step,
                    "fb_used_max_mib": (500.0, 1024.0, None)[step % 3],
                    "namespace": "ml" if pod else None,
                    "pod": pod,
                    "owner_kind": "PyTorchJob" if pod and step > 2 else None,
                    "owner_name": "llama" if pod and step > 2 else None,
                }
            )
    return rows


def combine(rows: list[dict[str, Any]], key: tuple[str, ...], values: dict[str, Merge]) -> dict:
    """Rows with the same key merged as the upserts merge them."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        identity = tuple(row[column] for column in key)
        if identity not in merged:
            merged[identity] = dict(row)
            continue
        kept = merged[identity]
        for column, how in values.items():
            stored, new = kept[column], row[column]
            if how is Merge.ADD:
                kept[column] = stored + new
            elif how is Merge.KNOWN:
                kept[column] = new if new is not None else stored
            else:
                present = [value for value in (stored, new) if value is not None]
                pick = max if how is Merge.LARGER else min
                kept[column] = pick(present) if present else None
    return merged


def expected_gpu_rollup(tier: Tier, rows: list[dict[str, Any]]) -> dict:
    return combine(gpu_rollup_rows(tier, rows), (tier.column, *tier.key), GPU_VALUES)


def expected_pod_hour(rows: list[dict[str, Any]]) -> dict:
    cycles: dict[tuple[str, datetime], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cycles[row["node"], row["at"]].append(row)
    upserts = [upsert for cycle in cycles.values() for upsert in pod_rollup_rows(cycle, [])]
    return combine(upserts, ("hour", *POD_KEY), POD_VALUES)


def stored(connection: sa.Connection, table: sa.Table) -> dict:
    key = [column.name for column in table.primary_key.columns]
    return {
        tuple(row[column] for column in key): dict(row)
        for row in connection.execute(sa.select(table)).mappings()
    }


def assert_rollups_equal(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for identity, row in expected.items():
        for column, value in row.items():
            if isinstance(value, float):
                assert got[identity][column] == pytest.approx(value, rel=1e-12), column
            else:
                assert got[identity][column] == value, (identity, column)


# Revision 0009's columns, which the rows written at BEFORE do not have.
LATER_COLUMNS = {
    "gpu_i_id",
    "mig_profile",
    "gpu_model",
    "sharing",
    "replicas",
    "sm_active_p95",
    "sm_active_mean",
    "dram_active_p95",
}


def raw_rows(connection: sa.Connection) -> list[tuple[Any, ...]]:
    columns = [column for column in gpu_window.c if column.name not in LATER_COLUMNS]
    query = sa.select(*columns).order_by(gpu_window.c.id)
    return [tuple(row) for row in connection.execute(query)]


def relation_kind(connection: sa.Connection, table: str) -> str:
    return str(
        connection.execute(
            sa.text("SELECT relkind FROM pg_class WHERE relname = :table"), {"table": table}
        ).scalar()
    )


def test_existing_rows_are_rolled_up_and_the_migration_goes_down_and_up_again(
    store_url: str,
) -> None:
    engine = create_store_engine(parse_store_url(store_url), create_file=True)
    rows = old_rows()

    try:
        migrate(engine, BEFORE)
        with engine.begin() as connection:
            connection.execute(sa.insert(gpu_window), rows)
            written = raw_rows(connection)
        migrate(engine, "head")
        with engine.connect() as connection:
            assert raw_rows(connection) == written
            tiers = ((GPU_HOUR, gpu_hour), (GPU_DAY, gpu_day), (GPU_JOB_DAY, gpu_job_day))
            for tier, table in tiers:  # gpu_job_day: revision 0013's sums of gpu_day
                assert_rollups_equal(stored(connection, table), expected_gpu_rollup(tier, rows))
            assert_rollups_equal(stored(connection, pod_hour), expected_pod_hour(rows))
            if engine.dialect.name == "postgresql":
                assert relation_kind(connection, "gpu_window") == "p"
                assert relation_kind(connection, "gpu_window_p20261101") == "r"
        migrate(engine, BEFORE, down=True)
        with engine.connect() as connection:
            assert raw_rows(connection) == written
            tables = set(sa.inspect(connection).get_table_names())
            assert not tables & {"gpu_hour", "gpu_day", "gpu_job_day", "pod_hour", "store_horizon"}
            if engine.dialect.name == "postgresql":
                assert relation_kind(connection, "gpu_window") == "r"
        migrate(engine, "head")
        with engine.begin() as connection:
            assert raw_rows(connection) == written
            assert_rollups_equal(stored(connection, gpu_hour), expected_gpu_rollup(GPU_HOUR, rows))
            # The id sequence carries on after the copies.
            connection.execute(sa.insert(gpu_window), [rows[-1]])
            ids = [row[0] for row in raw_rows(connection)]
            assert ids == sorted(set(ids))
    finally:
        engine.dispose()


def test_a_store_without_rows_migrates_to_empty_rollups(store_url: str) -> None:
    engine = create_store_engine(parse_store_url(store_url), create_file=True)
    config = alembic_config()
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, BEFORE)
            command.upgrade(config, "head")
        with engine.connect() as connection:
            for table in (gpu_hour, gpu_day, gpu_job_day, pod_hour):
                assert (
                    connection.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0
                )
    finally:
        engine.dispose()


def report_figures(connection: sa.Connection, *, rollups: bool = True) -> dict[str, Any]:
    """The node, GPU and waste figures of one report over the old rows and the new cycle."""
    report = build_report(
        connection,
        since=T0 - timedelta(hours=3),
        until=AT + timedelta(hours=1),
        views=["node", "gpu", "waste"],
        rollups=rollups,
    )
    return {
        "gpus": [asdict(gpu) for gpu in report.gpus],
        "nodes": [asdict(node) for node in report.nodes],
        "waste": [asdict(waste) for waste in report.waste],
    }


def flat(value: Any, path: str = "") -> dict[str, Any]:
    """Nested dicts and lists as one dict keyed by path, for pytest.approx."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{path}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{path}/{i}").items()}
    return {path: value}


def assert_figures_equal(got: dict[str, Any], expected: dict[str, Any]) -> None:
    got_flat, expected_flat = flat(got), flat(expected)
    assert got_flat.keys() == expected_flat.keys()
    for key, value in got_flat.items():
        if isinstance(value, float):
            assert value == pytest.approx(expected_flat[key], rel=1e-9, abs=1e-9), key
        else:
            assert value == expected_flat[key], key


def test_report_figures_hold_on_old_and_new_rows_across_down_and_up(store_url: str) -> None:
    """Rows of revision 0006 and rows the current writer adds give the same report from the
    rollups as from the raw rows, and the same again after going down to 0006 and back up."""
    engine = create_store_engine(parse_store_url(store_url), create_file=True)

    try:
        migrate(engine, BEFORE)
        with engine.begin() as connection:
            connection.execute(sa.insert(gpu_window), old_rows())
        migrate(engine, "head")
        store = TableStore(store_url)
        store.publish(sample_cycle())
        store.close()
        with engine.connect() as connection:
            before = report_figures(connection)
            assert_figures_equal(report_figures(connection, rollups=False), before)
        assert {gpu["node"] for gpu in before["gpus"]} == {"node-a"}
        assert sum(sum(gpu["hours_by_job_type"].values()) for gpu in before["gpus"]) > 0
        migrate(engine, BEFORE, down=True)
        migrate(engine, "head")
        with engine.connect() as connection:
            assert_figures_equal(report_figures(connection), before)
            assert_figures_equal(report_figures(connection, rollups=False), before)
    finally:
        engine.dispose()
