"""The table store at cluster scale on a real PostgreSQL (and PgBouncer): reports over 8,000
GPUs x 30 days, dropping a day's partition, and (``bench_store_writers.py``) many writers.

Run by hand from the repository root; the servers live in a folder between commands::

    .venv/bin/python benchmarks/bench_store.py start /tmp/store-bench
    .venv/bin/python benchmarks/bench_store.py fill-history /tmp/store-bench --gpus 8000 --days 30
    .venv/bin/gpu-profiler report --store-url URL --by node --since 30d --until 2026-11-26T07:42:37Z
    .venv/bin/python benchmarks/bench_store.py drop-day /tmp/store-bench 2026-11-23
    .venv/bin/python benchmarks/bench_store.py stop /tmp/store-bench

``fill-history`` writes the rollups and the raw rows the reports read directly with SQL (the
write path itself is measured by ``bench_store_writers.py``): ``gpu_hour`` (one row per GPU and
hour), ``gpu_day``, ``gpu_job_day`` and ``pod_hour`` summed from it, ``pod_usage`` (one pod per
node and 6 hours), and raw ``gpu_window`` rows every 30 s (a cycle's default interval;
``refill-edges`` writes them again at another cadence) for the hours a report's edges read:
around the range starts of ``--since 30d`` and ``--since 24h`` and the last hour, plus, with
``--full-day``, one whole day for ``drop-day``. The synthetic cluster is described at ``KEYS``;
rows are inserted in time order, as daemons write them. ``end-to-end`` writes the same cluster
through the daemon's write path instead (``TableStore.publish``), and ``before-store`` a store
of the revision before the rollups, for the report as it was.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import store_server  # noqa: E402
from profiler_app.core.model import (  # noqa: E402
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodUsage,
)
from profiler_app.sinks.store import TableStore  # noqa: E402
from profiler_app.sinks.store.dbapi import Database  # noqa: E402
from profiler_app.sinks.store.partitions import SCHEMES, PartitionKeeper  # noqa: E402
from profiler_app.sinks.store.retention import Retention  # noqa: E402
from profiler_app.sinks.store.urls import parse_store_url  # noqa: E402

END = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)  # as the shared generator's stores end
DAY = timedelta(days=1)
BEFORE_REVISION = "0006"  # the store's schema before the rollups

# The synthetic cluster, per GPU g and hour index h since the start: node n has a role (its
# job type: training, inference, bursty, training); each 6-hour block runs a new pod of the
# node's workload of the day, except one block in four, when the GPUs sit idle (the pod still
# holding them on even nodes, with its memory on every fourth). j: 0 training, 1 inference,
# 2 idle, 3 bursty. ``cycle_of`` writes the same through the daemon's path. A node's workload
# changes ``--workloads-per-day`` times a day (1 by default: the fewest rollup rows a store can
# have; 2 is the second workload per GPU-day).
KEYS = """
  n AS n, h AS h,
  CASE WHEN (n + h / 6) % 4 = 3 THEN 2 ELSE (ARRAY[0, 1, 3, 0])[n % 4 + 1] END AS j,
  (n + h / 6) % 4 <> 3 OR n % 2 = 0 AS has_pod,
  'node-' || lpad(n::text, 4, '0') AS node, (g % 8)::text AS gpu,
  'GPU-' || lpad(g::text, 5, '0') AS uuid
"""
COLUMNS = """
  (ARRAY['training', 'inference', 'idle', 'bursty'])[j + 1] AS job_type,
  j <> 2 OR n % 4 = 0 AS memory_held,
  CASE WHEN has_pod THEN 'team-' || n % 20 ELSE '' END AS namespace,
  CASE WHEN has_pod THEN 'job-' || n || '-' || h / 6 ELSE '' END AS pod,
  CASE WHEN has_pod THEN (ARRAY['PyTorchJob', 'Deployment', 'Job', 'PyTorchJob'])[n % 4 + 1]
    ELSE '' END AS owner_kind,
  CASE WHEN has_pod THEN 'w-' || (n * 7 + h * WORKLOADS_PER_DAY / 24) % 500 ELSE ''
    END AS owner_name,
  (ARRAY[0.05, 0.3, 1.0, 0.6])[j + 1] AS idle_fraction,
  (ARRAY[99.0, 70.0, 2.0, 95.0])[j + 1] AS util_max,
  (ARRAY[60.0, 30.0, 0.0, 40.0])[j + 1] AS mem_copy_util_max,
  CASE WHEN j <> 2 OR n % 4 = 0 THEN 30000.0 ELSE 500.0 END AS fb_used_max_mib,
  CASE WHEN j = 0 THEN 120.0 END AS period_seconds
"""


def columns(workloads_per_day: int) -> str:
    """``COLUMNS`` for a cluster whose nodes change workload this many times a day."""
    return COLUMNS.replace("WORKLOADS_PER_DAY", str(workloads_per_day))


def fill_history(
    servers: store_server.Servers, gpus: int, days: int, full_day: bool, workloads_per_day: int = 1
) -> None:
    start = END - timedelta(days=days + 1)
    hours = (days + 1) * 24
    url = servers.url()
    TableStore(url).close()  # migrates
    database = Database(parse_store_url(url))
    needs = [(table, start + timedelta(days=d)) for table in SCHEMES for d in range(days + 2)]
    PartitionKeeper().ensure(database, needs)
    database.close()
    began = time.monotonic()
    sql = servers.psql

    def step(what: str, statement: str) -> None:
        t = time.monotonic()
        sql(statement if statement.startswith("VACUUM") else f"SET TIME ZONE 'UTC'; {statement}")
        print(f"  {what}: {time.monotonic() - t:.0f} s", flush=True)

    keyed = (
        f"SELECT *, {columns(workloads_per_day)} FROM (SELECT g, {KEYS}"
        f" FROM generate_series(0, {gpus - 1}) AS g,"
        f" generate_series(0, {hours - 1}) AS h, LATERAL (SELECT g / 8 AS n) AS node) AS k"
    )
    step(
        "gpu_hour",
        "INSERT INTO gpu_hour SELECT timestamptz '"
        + start.isoformat()
        + "' + h * interval '1 hour',"
        " node, gpu, uuid, job_type, memory_held, namespace, pod, owner_kind, owner_name, 3600,"
        " 3600 * idle_fraction, util_max, mem_copy_util_max, fb_used_max_mib, 30, period_seconds,"
        " period_seconds, CASE WHEN j = 0 THEN 3600 ELSE 0 END,"
        f" coalesce(3600 * period_seconds, 0) FROM ({keyed}) AS rows ORDER BY h, g",
    )
    step(
        "gpu_day",
        "INSERT INTO gpu_day SELECT date_trunc('day', hour), node, gpu, uuid, job_type,"
        " memory_held, namespace, pod <> '', owner_kind, owner_name, sum(covered_seconds),"
        " sum(idle_gpu_seconds), max(util_max), max(mem_copy_util_max), max(fb_used_max_mib),"
        " max(covers_max_seconds), min(period_seconds_min), max(period_seconds_max),"
        " sum(period_covered_seconds), sum(period_weighted_sum) FROM gpu_hour"
        " GROUP BY 1, node, gpu, uuid, job_type, memory_held, namespace, pod <> '', owner_kind,"
        " owner_name ORDER BY 1",
    )
    step(
        "gpu_job_day",
        "INSERT INTO gpu_job_day SELECT day, node, gpu, uuid, gpu_i_id, job_type,"
        " sum(covered_seconds), sum(idle_gpu_seconds), max(util_max), max(mem_copy_util_max),"
        " max(fb_used_max_mib), max(covers_max_seconds), min(period_seconds_min),"
        " max(period_seconds_max), sum(period_covered_seconds), sum(period_weighted_sum)"
        " FROM gpu_day GROUP BY day, node, gpu, uuid, gpu_i_id, job_type ORDER BY day",
    )
    step(
        "pod_hour",
        "INSERT INTO pod_hour SELECT hour, node, namespace, pod, max(owner_kind), max(owner_name),"
        " count(*), sum(covered_seconds), sum(idle_gpu_seconds), max(util_max),"
        " max(mem_copy_util_max), max(fb_used_max_mib), 400, 2e10 FROM gpu_hour"
        " WHERE pod <> '' GROUP BY hour, node, namespace, pod ORDER BY hour",
    )
    step(
        "pod_usage",
        "INSERT INTO pod_usage SELECT namespace, pod, node, min(hour), '0,1,2,3,4,5,6,7',"
        " max(gpus), max(util_max), max(mem_copy_util_max), max(fb_used_max_mib), 400, 2e10,"
        " min(hour), max(hour) + interval '1 hour', 'PyTorchJob', max(owner_name)"
        " FROM pod_hour GROUP BY namespace, pod, node",
    )
    windows = edge_windows(days)
    if full_day:
        day = datetime(END.year, END.month, END.day, tzinfo=UTC) - timedelta(days=2)
        windows = [(low, high) for low, high in windows if high <= day or low >= day + DAY]
        windows.append((day, day + DAY - timedelta(seconds=30)))
    for low, high in windows:
        rows = raw_rows(start, gpus, low, high, workloads_per_day=workloads_per_day)
        step(f"gpu_window {low:%Y-%m-%d %H:%M} to {high:%H:%M}", rows)
    step("VACUUM ANALYZE", "VACUUM ANALYZE")
    print(f"filled in {time.monotonic() - began:.0f} s")
    for table in ("gpu_window", "gpu_hour", "gpu_day", "gpu_job_day", "pod_hour", "pod_usage"):
        count = sql(f"SELECT count(*) FROM {table}")
        size = sql(
            f"SELECT pg_size_pretty(coalesce(sum(pg_total_relation_size(relid)),"
            f" pg_total_relation_size('{table}'))) FROM"
            f" pg_partition_tree('{table}')"
        )
        print(f"  {table}: {int(count):,} rows, {size} with indexes")
    print(f"store URL: {url}")


def write_node_cycles(url: str, nodes: list[int], days: int, interval: float) -> int:
    """One process of ``end-to-end``: these nodes' cycles, in time order, through
    ``TableStore.publish`` (one transaction each, with its rollups); the cycles written."""
    store = TableStore(url, store_interval_seconds=interval)
    start = END - timedelta(days=days)
    steps = int(days * 86400 / interval)
    written = 0
    for step in range(1, steps + 1):
        at = start + timedelta(seconds=step * interval)
        hour = int((at - start).total_seconds() // 3600)
        for node in nodes:
            store.publish(cycle_of(node, hour, at))
            written += 1
    store.close()
    return written


def cycle_of(node: int, hour: int, at: datetime) -> CycleResult:
    """Node ``node``'s cycle at ``at``: the synthetic cluster of ``KEYS``, through the
    daemon's path."""
    job = 2 if (node + hour // 6) % 4 == 3 else (0, 1, 3, 0)[node % 4]
    has_pod = job != 2 or node % 2 == 0
    fb = 30000.0 if job != 2 or node % 4 == 0 else 500.0
    util = (99.0, 70.0, 2.0, 95.0)[job]
    stats = {
        GPU_UTIL: FieldStats(util, util, util / 2, (0.05, 0.3, 1.0, 0.6)[job]),
        MEM_COPY_UTIL: FieldStats(util / 2, util / 2, util / 4, 0.0),
        FB_USED: FieldStats(fb, fb, fb, 0.0),
    }
    name = f"node-{node:04d}"
    namespace = f"team-{node % 20}" if has_pod else None
    pod = f"job-{node}-{hour // 6}" if has_pod else None
    owner_kind = ("PyTorchJob", "Deployment", "Job", "PyTorchJob")[node % 4] if has_pod else None
    owner_name = f"w-{(node * 7 + hour // 24) % 500}" if has_pod else None
    gpus = [
        GpuProfile(
            str(gpu),
            f"GPU-{node * 8 + gpu:05d}",
            name,
            ("training", "inference", "idle", "bursty")[job],
            120.0 if job == 0 else None,
            stats,
            namespace=namespace,
            pod=pod,
            owner_kind=owner_kind,
            owner_name=owner_name,
            confidence=0.9,
            basis="util-loop",
            reasons=("period 120s in util",),
        )
        for gpu in range(8)
    ]
    pods = []
    if namespace and pod:
        started = END - timedelta(days=60) + timedelta(hours=hour // 6 * 6)
        gpu_ids = tuple(map(str, range(8)))
        pods.append(
            PodUsage(
                namespace,
                pod,
                name,
                started,
                gpu_ids,
                util,
                owner_kind=owner_kind,
                owner_name=owner_name,
            )
        )
    return CycleResult(name, at, 1800.0, gpus, pods)


def end_to_end(
    servers: store_server.Servers, gpus: int, days: int, interval: float, processes: int
) -> None:
    """``gpus`` GPUs x ``days`` days through the daemon's write path, then retention as the
    daemons run it (raw rows 14 days, rollups 400)."""
    # Straight to PostgreSQL: the pooler adds a hop to each of a cycle's statements, and this
    # fill is not what is timed (the writers benchmark goes through PgBouncer).
    url = servers.url()
    TableStore(url).close()  # migrates once
    nodes = list(range(gpus // 8))
    # A month of a cluster's commits in minutes: this fill does not wait for each commit's
    # fsync (the writers benchmark measures durable commits); the report is what is timed.
    servers.psql("ALTER SYSTEM SET synchronous_commit = off")
    servers.psql("SELECT pg_reload_conf()")
    began = time.monotonic()
    with multiprocessing.Pool(processes) as pool:
        written = sum(
            pool.starmap(
                write_node_cycles,
                [(url, nodes[n::processes], days, interval) for n in range(processes)],
            )
        )
    elapsed = time.monotonic() - began
    servers.psql("ALTER SYSTEM RESET synchronous_commit")
    servers.psql("SELECT pg_reload_conf()")
    print(
        f"{written:,} cycles ({written * 8:,} GPU rows) written in {elapsed:.0f} s,"
        f" {written / elapsed:.0f} transactions/s"
    )
    database = Database(parse_store_url(servers.url()))
    Retention(14 * 86400.0, 400 * 86400.0).prune(database, END)
    database.close()
    servers.psql("VACUUM ANALYZE")
    for table in ("gpu_window", "gpu_hour", "gpu_day", "gpu_job_day", "pod_hour", "pod_usage"):
        count = servers.psql(f"SELECT count(*) FROM {table}")
        print(f"  {table}: {int(count):,} rows")
    print(f"store URL: {url}")


def edge_windows(days: int) -> list[tuple[datetime, datetime]]:
    """The hours the reports over ``days`` and over 24 h (to ``END``) read raw rows for."""
    return [
        (END - timedelta(days=days, hours=1), END - timedelta(days=days) + timedelta(hours=1)),
        (END - timedelta(days=1, hours=1), END - timedelta(days=1) + timedelta(hours=1)),
        (END - timedelta(hours=1), END),
    ]


def raw_rows(
    start: datetime,
    gpus: int,
    low: datetime,
    high: datetime,
    interval: int = 30,
    *,
    workloads_per_day: int = 1,
) -> str:
    """INSERT of raw rows every ``interval`` seconds after ``low`` up to ``high``, each covering
    the time since the one before, with the keys of the hour it falls in."""
    first_hour = int((low - start).total_seconds() // 3600)
    steps = int((high - low).total_seconds() // interval)
    per_hour = 3600 // interval
    keyed = (
        f"SELECT *, {columns(workloads_per_day)} FROM (SELECT g, t, {KEYS}"
        f" FROM generate_series(0, {gpus - 1})"
        f" AS g, generate_series(1, {steps}) AS s,"
        f" LATERAL (SELECT timestamptz '{low.isoformat()}' + s * interval '{interval} s' AS t,"
        f" {first_hour} + (s - 1) / {per_hour} AS h, g / 8 AS n) AS k) AS rows"
    )
    return (
        "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, period_seconds,"
        " window_seconds, covers_seconds, util_max, util_p95, util_mean, util_idle_fraction,"
        " mem_copy_util_max, fb_used_max_mib, namespace, pod, confidence, basis, reasons,"
        " owner_kind, owner_name) SELECT t, node, gpu, uuid, job_type, period_seconds, 1800,"
        f" {interval}, util_max, util_max, util_max / 2, idle_fraction, mem_copy_util_max,"
        " fb_used_max_mib, nullif(namespace, ''), nullif(pod, ''), 0.9, 'util-loop',"
        " 'period 120s in util', nullif(owner_kind, ''), nullif(owner_name, '')"
        f" FROM ({keyed}) AS raw ORDER BY t, g"
    )


def refill_edges(
    servers: store_server.Servers, gpus: int, days: int, interval: int, workloads_per_day: int = 1
) -> None:
    """The raw rows the reports read, again at another cadence (``--store-interval``), and the
    rollups' longest row to match."""
    start = END - timedelta(days=days + 1)
    for low, high in edge_windows(days):
        began = time.monotonic()
        servers.psql(
            f"SET TIME ZONE 'UTC'; DELETE FROM gpu_window WHERE at > '{low.isoformat()}'"
            f" AND at <= '{high.isoformat()}';"
            f" {raw_rows(start, gpus, low, high, interval, workloads_per_day=workloads_per_day)}"
        )
        print(
            f"  gpu_window {low:%Y-%m-%d %H:%M} to {high:%H:%M} every {interval} s:"
            f" {time.monotonic() - began:.0f} s",
            flush=True,
        )
    for table in ("gpu_hour", "gpu_day", "gpu_job_day"):
        servers.psql(f"UPDATE {table} SET covers_max_seconds = {interval}")
    servers.psql("VACUUM ANALYZE")


def before_store(servers: store_server.Servers, database: str, gpus: int, days: int) -> None:
    """A store at ``BEFORE_REVISION`` (before the rollups) holding a row per GPU every 30 s for
    ``days`` days up to ``END``, four job types in turn; for the "before" figures, read by the
    report of that revision."""
    from alembic import command  # noqa: PLC0415

    from profiler_app.sinks.store.engine import alembic_config, create_store_engine  # noqa: PLC0415

    servers.psql(f"CREATE DATABASE {database}", database="postgres")
    url = servers.url().rsplit("/", 1)[0] + f"/{database}"
    engine = create_store_engine(parse_store_url(url), create_file=False)
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, BEFORE_REVISION)
    engine.dispose()
    steps = days * 2880
    began = time.monotonic()
    servers.psql(
        "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, period_seconds, window_seconds,"
        " covers_seconds, util_max, util_p95, util_mean, util_idle_fraction, mem_copy_util_max,"
        " fb_used_max_mib, namespace, pod, confidence, basis, reasons, owner_kind, owner_name)"
        f" SELECT timestamptz '{END.isoformat()}' - ({steps} - s) * interval '30 s',"
        " 'node-' || lpad(n::text, 4, '0'), g::text, 'GPU-' || lpad(n::text, 4, '0') || '-' || g,"
        " (ARRAY['training', 'inference', 'idle', 'bursty'])[(n + g) % 4 + 1],"
        " CASE WHEN (n + g) % 4 = 0 THEN 120.0 END, 1800, 30, 99, 95, 60, 0.1, 40, 30000, 'ml',"
        " 'pod-' || n || '-' || g % 2, 0.9, 'util-loop', 'period 120s in util', 'PyTorchJob',"
        f" 'job-' || n FROM generate_series(0, {gpus // 8 - 1}) AS n, generate_series(0, 7) AS g,"
        f" generate_series(0, {steps - 1}) AS s",
        database=database,
    )
    servers.psql("VACUUM ANALYZE", database=database)
    rows = int(servers.psql("SELECT count(*) FROM gpu_window", database=database))
    print(f"{rows:,} rows in {time.monotonic() - began:.0f} s; store URL: {url}")


def drop_day(servers: store_server.Servers, day: datetime) -> None:
    """Drops one day's raw partition through the retention code and times it."""
    partition = f"gpu_window_p{day:%Y%m%d}"
    rows = servers.psql(f"SELECT count(*) FROM {partition}")
    size = servers.psql(f"SELECT pg_size_pretty(pg_total_relation_size('{partition}'))")
    database = Database(parse_store_url(servers.url()))
    started = time.monotonic()
    # Cutoff: the end of that day, at a retention reaching just past it.
    Retention(3600.0).prune(database, day + timedelta(days=1, hours=1))
    elapsed = time.monotonic() - started
    database.close()
    gone = servers.psql(f"SELECT to_regclass('{partition}') IS NULL") == "t"
    print(f"dropped {partition} ({int(rows):,} rows, {size}): {gone}; {elapsed:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start PostgreSQL and PgBouncer in a new folder")
    start.add_argument("root", type=Path)
    start.add_argument("--pool-size", type=int, default=40)
    for name in ("stop", "url"):
        commands.add_parser(name).add_argument("root", type=Path)
    fill = commands.add_parser("fill-history", help="rollups and raw edges, directly")
    fill.add_argument("root", type=Path)
    fill.add_argument("--gpus", type=int, default=8000)
    fill.add_argument("--days", type=int, default=30)
    fill.add_argument("--full-day", action="store_true", help="also one whole day of raw rows")
    edges = commands.add_parser("refill-edges", help="the reports' raw rows at another cadence")
    edges.add_argument("root", type=Path)
    edges.add_argument("--gpus", type=int, default=8000)
    edges.add_argument("--days", type=int, default=30)
    edges.add_argument("--interval", type=int, default=300, help="seconds between raw rows")
    for command in (fill, edges):
        command.add_argument(
            "--workloads-per-day",
            type=int,
            default=1,
            help="times a day each node's workload changes",
        )
    e2e = commands.add_parser("end-to-end", help="GPUs x days through the real write path")
    e2e.add_argument("root", type=Path)
    e2e.add_argument("--gpus", type=int, default=1000)
    e2e.add_argument("--days", type=int, default=30)
    e2e.add_argument("--store-interval", type=float, default=300.0, help="seconds")
    e2e.add_argument("--processes", type=int, default=4)
    before = commands.add_parser("before-store", help="a store of raw rows before the rollups")
    before.add_argument("root", type=Path)
    before.add_argument("database")
    before.add_argument("--gpus", type=int, default=128)
    before.add_argument("--days", type=int, default=7)
    drop = commands.add_parser("drop-day", help="drop one day's raw partition, timed")
    drop.add_argument("root", type=Path)
    drop.add_argument("day", type=lambda text: datetime.fromisoformat(text).replace(tzinfo=UTC))
    args = parser.parse_args()
    if args.command == "start":
        servers = store_server.start(args.root, pool_size=args.pool_size)
        print(f"PostgreSQL {servers.url()}\nPgBouncer {servers.url(pooled=True)}")
        return
    servers = store_server.attach(args.root)
    if args.command == "stop":
        store_server.stop(servers)
    elif args.command == "url":
        print(servers.url())
    elif args.command == "fill-history":
        fill_history(servers, args.gpus, args.days, args.full_day, args.workloads_per_day)
    elif args.command == "refill-edges":
        refill_edges(servers, args.gpus, args.days, args.interval, args.workloads_per_day)
    elif args.command == "end-to-end":
        end_to_end(servers, args.gpus, args.days, args.store_interval, args.processes)
    elif args.command == "before-store":
        before_store(servers, args.database, args.gpus, args.days)
    elif args.command == "drop-day":
        drop_day(servers, args.day)


if __name__ == "__main__":
    main()
