"""Revision 0009_gpu_identity and the writer: a MIG instance is a GPU of its own in gpu_window
and the GPU rollups (gpu_i_id in their keys), with its profile, the GPU model and sharing. Up,
down and up again on SQLite and a real PostgreSQL (``integration``)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from profiler_app.reports.history import build_report, report_rows
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import gpu_day, gpu_hour, gpu_window
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.cycles import AT, gpu_profile, mig_profile, sample_cycle
from tests.support.migrations import migrate

pytest_plugins = ["tests.support.postgres"]

BEFORE = "0007_rollups"
NEW_COLUMNS = {
    "gpu_i_id",
    "mig_profile",
    "gpu_model",
    "sharing",
    "replicas",
    "sm_active_p95",
    "sm_active_mean",
    "dram_active_p95",
}


def seven_instances_and_a_whole_gpu() -> list[Any]:
    instances = [mig_profile("0", str(gi), "inference", util=gi / 10) for gi in range(1, 8)]
    shared = dataclasses.replace(gpu_profile("1", "bursty"), sharing="time-slicing", replicas=4)
    return [*instances, shared]


def write_cycles(url: str, cycles: int = 2) -> None:
    store = TableStore(url)
    try:
        for step in range(cycles):
            result = sample_cycle("node-a")
            at = AT + timedelta(minutes=5 * step)
            store.publish(
                dataclasses.replace(result, at=at, gpus=seven_instances_and_a_whole_gpu())
            )
    finally:
        store.close()


def rows(connection: sa.Connection, table: sa.Table, *columns: str) -> list[tuple[Any, ...]]:
    chosen = [table.c[name] for name in columns]
    return [tuple(row) for row in connection.execute(sa.select(*chosen).order_by(*chosen))]


def test_each_mig_instance_is_its_own_row_and_rollup(store_url: str) -> None:
    write_cycles(store_url)
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            raw = rows(
                connection,
                gpu_window,
                "gpu",
                "gpu_i_id",
                "mig_profile",
                "gpu_model",
                "sharing",
                "replicas",
            )
            assert len(raw) == 16
            instances = sorted({row[:4] for row in raw if row[1]})
            assert instances == [
                ("0", str(gi), "1g.10gb", "NVIDIA A100-SXM4-80GB") for gi in range(1, 8)
            ]
            assert ("1", "", None, None, "time-slicing", 4) in raw
            # The second cycle covers five minutes of each instance: found by its own last row.
            covers = rows(connection, gpu_window, "gpu_i_id", "covers_seconds")
            assert ("7", 300.0) in covers
            for table in (gpu_hour, gpu_day):
                keys = sorted(set(rows(connection, table, "gpu", "gpu_i_id")))
                assert keys == [("0", str(gi)) for gi in range(1, 8)] + [("1", "")]
            util = dict(rows(connection, gpu_hour, "gpu_i_id", "util_max"))
            assert util["3"] == 30.0  # GR_ENGINE_ACTIVE in percent
    finally:
        engine.dispose()


def test_the_revision_goes_down_and_up_again(store_url: str) -> None:
    write_cycles(store_url)
    engine = create_store_engine(parse_store_url(store_url), create_file=False)

    try:
        with engine.connect() as connection:
            whole = rows(connection, gpu_hour, "gpu", "uuid", "covered_seconds", "util_max")
        migrate(engine, BEFORE, down=True)
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            assert not NEW_COLUMNS & {c["name"] for c in inspector.get_columns("gpu_window")}
            assert "gpu_i_id" not in {c["name"] for c in inspector.get_columns("gpu_hour")}
            pod_columns = {c["name"] for c in inspector.get_columns("pod_usage")}
            assert "gpu_attribution" not in pod_columns
            key = inspector.get_pk_constraint("gpu_hour")["constrained_columns"]
            assert "gpu_i_id" not in key
            # Every raw row stays; the rollups keep the whole GPU's rows only.
            count = sa.text("SELECT count(*) FROM gpu_window")
            assert connection.execute(count).scalar() == 16
            kept = connection.execute(
                sa.text("SELECT gpu, uuid, covered_seconds, util_max FROM gpu_hour")
            ).all()
            assert sorted(tuple(row) for row in kept) == [row for row in whole if row[0] == "1"]
        migrate(engine, "head")
        with engine.connect() as connection:
            key = sa.inspect(connection).get_pk_constraint("gpu_hour")["constrained_columns"]
            assert key[:5] == ["hour", "node", "gpu", "uuid", "gpu_i_id"]
        write_cycles(store_url, cycles=1)
        with engine.connect() as connection:
            assert {row[0] for row in rows(connection, gpu_hour, "gpu_i_id")} == {
                "",
                *map(str, range(1, 8)),
            }
    finally:
        engine.dispose()


def test_the_gpu_report_has_a_row_per_instance_from_rollups_and_raw_rows(store_url: str) -> None:
    """``report --by gpu`` over whole hours (rollups) and edges (raw rows) alike."""
    write_cycles(store_url, cycles=3)
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    try:
        with engine.connect() as connection:
            reports = [
                report_rows(
                    build_report(
                        connection,
                        since=AT - timedelta(hours=3),
                        until=AT + timedelta(hours=1),
                        views=("gpu",),
                        rollups=rollups,
                    ),
                    "gpu",
                )
                for rollups in (True, False)
            ]
    finally:
        engine.dispose()
    for gpus in reports:
        assert [(row["gpu"], row["mig_instance"]) for row in gpus] == [
            *(("0", str(gi)) for gi in range(1, 8)),
            ("1", ""),
        ]
        assert [row["util_max_percent"] for row in gpus[:7]] == [gi * 10.0 for gi in range(1, 8)]
    assert reports[0] == reports[1]
