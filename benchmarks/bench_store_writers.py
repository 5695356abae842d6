"""Many daemons writing one PostgreSQL through PgBouncer: 1,000 simulated daemons of 8 GPUs on a
30 s cycle, on a compressed clock, through the real write path (``TableStore.publish``, one
transaction per cycle with its rollups) and the daemon's back-off (``profiler_app.core.backoff``).

Run by hand from the repository root::

    .venv/bin/python benchmarks/bench_store_writers.py --daemons 1000 --minutes 10 --speed 5 \\
        --kill-at 4 --down 20

It starts PostgreSQL and PgBouncer (transaction pooling, ``--pool-size`` server connections) in a
temporary folder, migrates the store once, then runs the daemons as threads in ``--processes``
worker processes, each daemon with its own connection to PgBouncer, its cycles spread over the
30 s. Simulated time runs ``--speed`` times faster than the wall clock: each row's time is the
simulated one, and so are the back-off's clock and PgBouncer's waits (``query_wait_timeout``
10 s, ``server_login_retry`` 15 s, both divided by the speed). With ``--kill-at M`` PostgreSQL
is killed (``pg_ctl stop -m immediate``) at simulated minute M and started again ``--down`` wall
seconds later; the daemons keep cycling and back off meanwhile.

Checked at the end, against what each daemon saw committed: every committed cycle's rows are in
the store (none lost) and none other than those and the ambiguous ones (a commit the server made
whose answer was lost with the connection); each GPU's stored covered time equals what its rows'
times give (the first row a window, then the time since the previous row, capped at the window),
and so do the hourly and both daily rollups; PostgreSQL's client connections, sampled every 0.2 s,
stay within the pool. Prints latency percentiles of the committed cycles' writes.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import store_server  # noqa: E402
from profiler_app.core.backoff import MAX_BACKOFF_INTERVALS, Backoff  # noqa: E402
from profiler_app.core.model import (  # noqa: E402
    FB_USED,
    GPU_UTIL,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodUsage,
)
from profiler_app.sinks.store import StoreError, TableStore  # noqa: E402

SIM_START = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
CYCLE = 30.0
WINDOW = 1800.0
GPUS = 8
JOBS = ("training", "inference", "idle", "bursty")
SIMULATED = "node LIKE 'sim-%'"  # this benchmark's nodes, not a full store's own


def node_name(index: int) -> str:
    return f"sim-{index:04d}"


def profiles(index: int) -> tuple[list[GpuProfile], list[PodUsage]]:
    """A node's GPUs: one 8-GPU job on most nodes, idle GPUs on every fifth."""
    job = JOBS[index % 4] if index % 5 else "idle"
    pod = None if job == "idle" else f"job-{index}"
    stats = {
        GPU_UTIL: FieldStats(90.0, 85.0, 60.0, 0.05 if pod else 1.0),
        FB_USED: FieldStats(30000.0, 30000.0, 29000.0, 0.0),
    }
    gpus = [
        GpuProfile(
            str(gpu),
            f"GPU-{index:04d}-{gpu}",
            node_name(index),
            job,
            120.0 if job == "training" else None,
            stats,
            namespace="ml" if pod else None,
            pod=pod,
            owner_kind="PyTorchJob" if pod else None,
            owner_name=f"job-{index % 100}" if pod else None,
        )
        for gpu in range(GPUS)
    ]
    pods = []
    if pod:
        pods.append(
            PodUsage("ml", pod, node_name(index), SIM_START, tuple(map(str, range(GPUS))), 90.0)
        )
    return gpus, pods


@dataclass(frozen=True)
class Plan:
    url: str
    began_wall: float  # time.time() at simulated second 0, the same in every process
    speed: float
    cycles: int


def run_daemon(index: int, plan: Plan, began: float, out: dict[str, Any]) -> None:
    """One simulated daemon: a cycle every 30 simulated seconds, with the daemon's back-off."""
    speed = plan.speed

    def sim_now() -> float:  # simulated seconds since SIM_START
        return (time.monotonic() - began) * speed

    phase = random.Random(index).uniform(0, CYCLE)
    backoff = Backoff(CYCLE, MAX_BACKOFF_INTERVALS * CYCLE, clock=sim_now)
    gpus, pods = profiles(index)
    store = TableStore(plan.url)
    committed, latencies, failures, attempts = [], [], [], []
    for cycle in range(plan.cycles):
        due = phase + cycle * CYCLE
        time.sleep(max(0.0, (due - sim_now()) / speed))
        if not backoff.ready():
            continue  # waiting out the back-off: the cycle is not tried (as Cycle does)
        at = SIM_START + timedelta(seconds=due)
        attempts.append(due)
        started = time.monotonic()
        try:
            store.publish(CycleResult(node_name(index), at, WINDOW, gpus, pods))
        except StoreError as error:
            backoff.failed(since=due)
            failures.append([due, str(error)[:200]])
            continue
        latencies.append(time.monotonic() - started)
        committed.append(at.isoformat())
        backoff.succeeded()
    store.close()
    out[node_name(index)] = {
        "committed": committed,
        "latencies": latencies,
        "failures": failures,
        "attempts": attempts,
    }


def worker(indexes: list[int], plan: Plan, path: str) -> None:
    began = time.monotonic() - (time.time() - plan.began_wall)
    results: dict[str, Any] = {}
    threads = [threading.Thread(target=run_daemon, args=(i, plan, began, results)) for i in indexes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    Path(path).write_text(json.dumps(results))


def expected_covers(times: list[datetime]) -> float:
    """A GPU's covered seconds as its rows' times give them (how the sink computes them)."""
    total, previous = 0.0, None
    for at in sorted(times):
        total += WINDOW if previous is None else min((at - previous).total_seconds(), WINDOW)
        previous = at
    return total


def verify(servers: store_server.Servers, results: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, list[datetime]] = {}
    listing = servers.psql(
        "SET TIME ZONE 'UTC'; SELECT node, string_agg(to_char(at, 'YYYY-MM-DD\"T\"HH24:MI:SS.US'),"
        " ',' ORDER BY at) FROM (SELECT DISTINCT node, at FROM gpu_window"
        f" WHERE {SIMULATED}) AS cycles"
        " GROUP BY node"
    )
    for line in listing.splitlines():
        node, times = line.split("|")
        rows[node] = [datetime.fromisoformat(t).replace(tzinfo=UTC) for t in times.split(",")]
    per_gpu = servers.psql(
        f"SELECT count(*) FROM gpu_window WHERE {SIMULATED} GROUP BY node, gpu HAVING count(*) > 0"
    )
    lost = extra = 0
    for node, result in results.items():
        sent = {datetime.fromisoformat(at) for at in result["committed"]}
        stored = set(rows.get(node, []))
        lost += len(sent - stored)
        extra += len(stored - sent)
    covers = {
        node: expected_covers(times) * GPUS for node, times in rows.items()
    }  # every GPU of a node has the node's rows
    stored_covers = dict(
        line.split("|")
        for line in servers.psql(
            f"SELECT node, sum(covers_seconds) FROM gpu_window WHERE {SIMULATED} GROUP BY node"
        ).splitlines()
    )
    covers_off = sum(
        abs(float(stored_covers[node]) - expected) > 1e-6 for node, expected in covers.items()
    )
    # Continuity: each node's rows span from its first row's window to its last row with no
    # gap longer than the window (an outage shorter than it is covered by the row after it).
    holes = sum(
        any((b - a).total_seconds() > WINDOW for a, b in itertools.pairwise(times))
        for times in rows.values()
    )
    continuous = sum(
        abs(covers[node] - GPUS * (WINDOW + (times[-1] - times[0]).total_seconds())) < 1e-6
        for node, times in rows.items()
    )
    raw_total = float(servers.psql(f"SELECT sum(covers_seconds) FROM gpu_window WHERE {SIMULATED}"))
    hour_total = float(servers.psql(f"SELECT sum(covered_seconds) FROM gpu_hour WHERE {SIMULATED}"))
    day_total = float(servers.psql(f"SELECT sum(covered_seconds) FROM gpu_day WHERE {SIMULATED}"))
    job_day_total = float(
        servers.psql(f"SELECT sum(covered_seconds) FROM gpu_job_day WHERE {SIMULATED}")
    )
    return {
        "cycles committed": sum(len(r["committed"]) for r in results.values()),
        "rows stored": int(servers.psql(f"SELECT count(*) FROM gpu_window WHERE {SIMULATED}")),
        "GPUs with rows": len(per_gpu.splitlines()),
        "committed cycles missing from the store": lost,
        "stored cycles not seen committed (ambiguous commits)": extra,
        "nodes whose covered time differs from their rows' times": covers_off,
        "nodes with a gap longer than the window": holes,
        "nodes covered from first row to last without a hole": f"{continuous} of {len(rows)}",
        "covered GPU-hours: raw, hourly rollup, daily rollups (gpu_day, gpu_job_day)": (
            round(raw_total / 3600, 4),
            round(hour_total / 3600, 4),
            round(day_total / 3600, 4),
            round(job_day_total / 3600, 4),
        ),
    }


def watch(
    servers: store_server.Servers,
    processes: list[multiprocessing.Process],
    plan: Plan,
    kill_at: float | None,
    down: float,
) -> tuple[list[int], list[str]]:
    """Samples PostgreSQL's client connections until the workers end, killing and restarting
    PostgreSQL on the way when asked; the samples and what happened."""
    connections: list[int] = []
    events: list[str] = []
    killed_at: float | None = None
    restarted = False

    def sim_minutes() -> float:
        return (time.time() - plan.began_wall) * plan.speed / 60

    while any(process.is_alive() for process in processes):
        time.sleep(0.2)
        if kill_at is not None and killed_at is None and sim_minutes() >= kill_at:
            servers.postgres.stop()  # pg_ctl stop -m immediate: a crash
            killed_at = time.time()
            events.append(f"PostgreSQL killed at simulated minute {sim_minutes():.2f}")
        if killed_at is not None and not restarted:
            if time.time() - killed_at >= down:
                servers.postgres.resume()
                events.append(f"PostgreSQL restarted at simulated minute {sim_minutes():.2f}")
                restarted = True
            continue
        with contextlib.suppress(RuntimeError):  # a sample lost while it restarts
            connections.append(servers.server_connections())
    return connections, events


def report(results: dict[str, Any], connections: list[int], events: list[str]) -> None:
    latencies = sorted(t for r in results.values() for t in r["latencies"])
    failures = [f for r in results.values() for f in r["failures"]]
    attempts = Counter(int(due // 60) for r in results.values() for due in r["attempts"])
    failed = Counter(int(due // 60) for due, _ in failures)
    quantiles = statistics.quantiles(latencies, n=100)
    for event in events:
        print(event)
    print(
        f"write latency (committed cycles): p50 {quantiles[49] * 1000:.1f} ms, p95"
        f" {quantiles[94] * 1000:.1f} ms, p99 {quantiles[98] * 1000:.1f} ms, max"
        f" {latencies[-1] * 1000:.1f} ms"
    )
    print(
        "writes tried / failed per simulated minute: "
        + ", ".join(f"{m}: {attempts[m]}/{failed[m]}" for m in sorted(attempts))
    )
    by_minute: dict[tuple[int, str], int] = Counter(
        (int(due // 60), error.split(": ", 1)[-1]) for due, error in failures
    )
    for (minute, error), count in sorted(by_minute.items()):
        print(f"  minute {minute}: {count} x {error}")
    errors = sorted({f[1].split(": ", 1)[-1] for f in failures})
    print(f"failed writes: {len(failures)}, {len(errors)} distinct errors")
    for error in errors[:5]:
        print(f"  {error}")
    print(f"PostgreSQL client connections: max {max(connections)} in {len(connections)} samples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--daemons", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0, help="simulated minutes")
    parser.add_argument("--speed", type=float, default=5.0, help="simulated seconds per second")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--pool-size", type=int, default=40)
    parser.add_argument("--kill-at", type=float, help="simulated minute to kill PostgreSQL at")
    parser.add_argument("--down", type=float, default=20.0, help="wall seconds it stays down")
    parser.add_argument(
        "--servers",
        type=Path,
        help="write into the store of servers bench_store.py start left in this folder (a full"
        " store) instead of new, empty ones; PgBouncer's waits then run on the wall clock",
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="store-writers-"))
    folder.chmod(0o755)  # the server runs as the postgres user when we are root
    root = folder / "servers"
    if args.servers is not None:
        servers = store_server.attach(args.servers)
        root = folder
        args.pool_size = json.loads((args.servers / "servers.json").read_text())["pool_size"]
    else:
        # PgBouncer's own waits (for a server connection, between failed logins) run on the
        # same compressed clock as the daemons.
        servers = store_server.start(root, pool_size=args.pool_size, time_scale=args.speed)
    try:
        TableStore(servers.url()).close()  # migrated once, as the first daemon would
        plan = Plan(servers.url(pooled=True), time.time() + 3.0, args.speed, int(args.minutes * 2))
        outputs = [root / f"worker-{n}.json" for n in range(args.processes)]
        processes = [
            multiprocessing.Process(
                target=worker,
                args=(list(range(n, args.daemons, args.processes)), plan, str(outputs[n])),
            )
            for n in range(args.processes)
        ]
        for process in processes:
            process.start()
        connections, events = watch(servers, processes, plan, args.kill_at, args.down)
        results: dict[str, Any] = {}
        for output in outputs:
            results.update(json.loads(output.read_text()))
        print(
            f"{args.daemons} daemons x {GPUS} GPUs, {args.minutes:g} simulated minutes at"
            f" {args.speed:g}x ({plan.cycles} cycles each), PgBouncer pool of {args.pool_size}"
        )
        report(results, connections, events)
        for what, value in verify(servers, results).items():
            print(f"{what}: {value}")
    finally:
        if args.servers is None:
            store_server.stop(servers)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
