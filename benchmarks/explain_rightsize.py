"""EXPLAIN ANALYZE of ``report --by rightsize``'s queries on a store filled by SQL.

For query plans only, not for report figures: the rows are made by ``generate_series`` with the
cardinality of a churning cluster (``bench_reports.py``'s: workloads drawn from 400, about five
per GPU-day, a window's buckets spread over about 18 points per metric), not by the writer.

    python -m benchmarks.explain_rightsize start ROOT            # PostgreSQL + PgBouncer
    python -m benchmarks.explain_rightsize fill ROOT --gpus 1000 --days 30   # revision 0010
    python -m benchmarks.explain_rightsize explain ROOT --since 30d          # the code on the path

``fill`` migrates the database ``profiler`` to revision 0010 (per GPU) and fills its day tier for
``--days`` days and its hour tier for the first and last two days; ``explain`` runs the report's
right-sizing over ``--since`` up to ``--until`` (default: 13:30 on the data's last day, so the
range has partial hours at its ends) with every statement captured, then EXPLAIN
ANALYZEs each one (TIMING OFF: the clock calls per row would dominate) and prints its time and the
plan's top line. Migrating the database to the head (``gpu-profiler`` migrates on first use) shows
the revision's effect.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.store_server import attach, start
from profiler_app.core.durations import parse_duration
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.migrations import migrate

END = datetime(2026, 11, 29, tzinfo=UTC)
KEY = "node, gpu, uuid, gpu_i_id, namespace, workload"


def _fill_sql(bucket: str, first: datetime, last: datetime, step: str, gpus: int) -> list[str]:
    """The 0010 tables' rows of ``bucket`` from ``first`` to ``last``: per GPU and day, five
    workloads, each with 18 buckets per metric; per GPU and hour, two, with 6 buckets."""
    workloads, spread = (5, 18) if bucket == "day" else (2, 6)
    base = (
        f"SELECT b AS {bucket}, 'node-' || (g / 8) AS node, (g % 8)::text AS gpu,"
        " 'GPU-' || g AS uuid, '' AS gpu_i_id, 'team-' || (w % 25) AS namespace,"
        " 'w' || w AS workload, g, k, extract(epoch FROM b)::bigint / 3600 AS n"
        f" FROM generate_series(timestamptz '{first.isoformat()}',"
        f" timestamptz '{last.isoformat()}', interval '{step}') AS b,"
        f" generate_series(0, {gpus - 1}) AS g, generate_series(0, {workloads - 1}) AS k,"
        " LATERAL (SELECT ((g * 7 + (extract(epoch FROM b)::bigint / 86400) * 13 + k * 97)"
        " % 400) AS w) AS pick"
    )
    hours = 1.0 if bucket == "hour" else 24.0
    return [
        f"INSERT INTO rightsize_{bucket} ({bucket}, {KEY}, covered_seconds, idle_gpu_seconds,"
        " util_max, fb_used_max_mib, covers_max_seconds, first_start, last_end,"
        " period_covered_seconds, gpu_model, mig_profile)"
        f" SELECT {bucket}, {KEY}, {720 * hours}, {72 * hours}, 40 + (g + k) % 60,"
        " 1000 + 10 * ((g + n) % 7000), 300, "
        f" {bucket}, {bucket} + interval '{step}', 0, 'NVIDIA H100 80GB HBM3', NULL"
        f" FROM ({base}) AS base",
        f"INSERT INTO activity_{bucket} ({bucket}, {KEY}, metric, percent, seconds)"
        f" SELECT {bucket}, {KEY}, metric, ((g + k + n) % 80) + step, {40 * hours}"
        f" FROM ({base}) AS base, unnest(ARRAY['sm', 'sm_mean', 'dram']) AS metric,"
        f" generate_series(0, {spread - 1}) AS step",
    ]


def fill(root: Path, gpus: int, days: int) -> None:
    servers = attach(root)
    url = servers.url()
    engine = create_store_engine(parse_store_url(url), create_file=False)
    migrate(engine, "0010_rightsize_rollups")
    first = END - timedelta(days=days)
    month = first.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    months = []
    while month < END:  # the migration made this month's and the next's
        months.append(month)
        month = (month + timedelta(days=32)).replace(day=1)
    statements = [
        f"CREATE TABLE IF NOT EXISTS {table}_p{month:%Y%m} PARTITION OF {table} FOR VALUES"
        f" FROM ('{month.isoformat()}') TO ('{(month + timedelta(days=32)).replace(day=1)}')"
        for month in months
        for table in ("rightsize_day", "rightsize_hour", "activity_day", "activity_hour")
    ] + [
        *_fill_sql("day", first, END - timedelta(days=1), "1 day", gpus),
        *_fill_sql("hour", first, first + timedelta(hours=47), "1 hour", gpus),
        *_fill_sql("hour", END - timedelta(days=2), END - timedelta(hours=1), "1 hour", gpus),
    ]
    with engine.begin() as connection:
        raw = connection.connection.driver_connection  # no parameters: '%' is modulo
        assert raw is not None
        for statement in statements:
            began = time.monotonic()
            raw.execute(statement)
            print(f"{time.monotonic() - began:6.1f} s  {statement[:60]}")
    engine.dispose()
    servers.psql("VACUUM ANALYZE")


def explain(root: Path, since: str, database: str, until: datetime) -> None:
    from profiler_app.reports.rightsize import workload_usages  # noqa: PLC0415

    url = attach(root).url(pooled=True).rsplit("/", 1)[0] + f"/{database}"
    engine = create_store_engine(parse_store_url(url), create_file=False)
    captured: list[tuple[str, Any]] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            captured.append((statement, parameters))

    with engine.connect() as connection:
        began = time.monotonic()
        found = workload_usages(
            connection, since=until - timedelta(seconds=parse_duration(since)), until=until
        )
        took = time.monotonic() - began
        print(f"workload_usages: {len(found)} workloads in {took:.2f} s (warm: run it twice)")
        sa.event.remove(engine, "before_cursor_execute", _capture)
        total = 0.0
        for statement, parameters in captured:
            rows = connection.exec_driver_sql(
                f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) {statement}", parameters
            ).all()
            plan = [row[0] for row in rows]
            execution = next(line for line in plan if line.startswith("Execution Time"))
            total += float(execution.split()[2])
            print(f"{execution:32}  {plan[0][:90]}")
        print(f"sum of execution times: {total:.0f} ms over {len(captured)} statements")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("start", "fill", "explain"))
    parser.add_argument("root", type=Path)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--since", default="30d")
    parser.add_argument(
        "--until",
        type=datetime.fromisoformat,
        default=END - timedelta(hours=10, minutes=30),  # hours and raw edges, not whole days
    )
    parser.add_argument("--database", default="profiler", help="explain: a copy (createdb -T)")
    args = parser.parse_args()
    if args.command == "start":
        start(args.root)
    elif args.command == "fill":
        fill(args.root, args.gpus, args.days)
    else:
        explain(args.root, args.since, args.database, args.until)


if __name__ == "__main__":
    main()
