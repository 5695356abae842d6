"""Pods' disk and network rates in the store (revision 0008), on SQLite and a real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from alembic import command

from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    NETWORK_RECEIVE,
    NETWORK_TRANSMIT,
    IoRates,
    RateStats,
)
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import alembic_config, create_store_engine
from profiler_app.sinks.store.schema import POD_HOUR_IO_COLUMNS, POD_IO_COLUMNS
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.store_cycles import T0, cycle, fetch, pod, profile

pytest_plugins = ["tests.support.postgres"]

MB = 1e6


def rates(read: float, received: float | None, *, attributable: bool = True) -> IoRates:
    stats = {
        DISK_READ: RateStats(max=read, p95=read / 4),
        DISK_WRITE: RateStats(max=2 * MB, p95=1 * MB),
    }
    if received is not None:
        stats[NETWORK_RECEIVE] = RateStats(max=received, p95=received / 2)
        stats[NETWORK_TRANSMIT] = RateStats(max=3 * MB, p95=3 * MB)
    return IoRates(stats, network_attributable=attributable)


def columns(url: str, table: str) -> set[str]:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return {column["name"] for column in sa.inspect(connection).get_columns(table)}
    finally:
        engine.dispose()


def migrate(url: str, revision: str, *, down: bool = False, sql: str | None = None) -> None:
    config = alembic_config()
    engine = create_store_engine(parse_store_url(url), create_file=True)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            (command.downgrade if down else command.upgrade)(config, revision)
            if sql is not None:
                connection.execute(sa.text(sql), {"at": T0.replace(tzinfo=None)})
    finally:
        engine.dispose()


def test_the_revision_adds_empty_columns_and_goes_back(store_url: str) -> None:
    migrate(
        store_url,
        "0007_rollups",
        sql="INSERT INTO pod_usage (namespace, pod, node, pod_start_time, gpus, gpu_count,"
        " cpu_util_max, first_seen, last_seen) VALUES ('ml', 'a', 'n', :at, '0', 1, 50, :at, :at)",
    )
    migrate(store_url, "head")
    assert set(POD_IO_COLUMNS) | {"network_attributable"} <= columns(store_url, "pod_usage")
    assert set(POD_HOUR_IO_COLUMNS) <= columns(store_url, "pod_hour")
    row = fetch(
        store_url,
        "SELECT pod, cpu_util_max, disk_read_bytes_per_second_max, network_attributable"
        " FROM pod_usage",
    )
    assert [tuple(r) for r in row] == [("a", 50.0, None, None)]
    migrate(store_url, "0007_rollups", down=True)
    assert not columns(store_url, "pod_usage") & {*POD_IO_COLUMNS, "network_attributable"}
    assert not columns(store_url, "pod_hour") & set(POD_HOUR_IO_COLUMNS)
    assert [tuple(r) for r in fetch(store_url, "SELECT pod, cpu_util_max FROM pod_usage")] == [
        ("a", 50.0)
    ]


def test_rates_keep_the_largest_and_a_pod_without_them_keeps_its_own(
    store: TableStore, store_url: str
) -> None:
    store.publish(cycle(T0, [profile("0")], [pod(io=rates(100 * MB, 10 * MB))]))
    store.publish(
        cycle(T0 + timedelta(minutes=1), [profile("0")], [pod(io=rates(40 * MB, 90 * MB))])
    )
    store.publish(cycle(T0 + timedelta(minutes=2), [profile("0")], [pod()]))  # none this cycle
    rows = fetch(
        store_url,
        "SELECT disk_read_bytes_per_second_max, disk_read_bytes_per_second_p95,"
        " network_receive_bytes_per_second_max, network_receive_bytes_per_second_p95,"
        " disk_write_bytes_per_second_p95, network_attributable FROM pod_usage",
    )
    assert [tuple(r) for r in rows] == [(100 * MB, 25 * MB, 90 * MB, 45 * MB, 1 * MB, True)]


def test_a_pod_whose_network_is_not_attributable_says_so(store: TableStore, store_url: str) -> None:
    store.publish(cycle(T0, [profile("0")], [pod(io=rates(5 * MB, None, attributable=False))]))
    rows = fetch(
        store_url,
        "SELECT disk_read_bytes_per_second_max, network_receive_bytes_per_second_max,"
        " network_attributable FROM pod_usage",
    )
    assert [tuple(r) for r in rows] == [(5 * MB, None, False)]


def test_pod_hour_keeps_each_hours_peaks(store: TableStore, store_url: str) -> None:
    store.publish(
        cycle(T0 + timedelta(minutes=30), [profile("0")], [pod(io=rates(7 * MB, 8 * MB))])
    )
    store.publish(
        cycle(T0 + timedelta(minutes=31), [profile("0")], [pod(io=rates(3 * MB, 9 * MB))])
    )
    rows = fetch(
        store_url,
        "SELECT disk_read_bytes_per_second_max, network_receive_bytes_per_second_max,"
        " network_transmit_bytes_per_second_max FROM pod_hour ORDER BY hour",
    )
    assert [tuple(r) for r in rows] == [(7 * MB, 9 * MB, 3 * MB)]
