"""Every ``report`` view in every format on a churning cluster written through the daemon's
writer, and an independent check of the figures against the raw rows.

Run by hand from the repository root::

    STORE=sqlite:////tmp/reports/profiler.db
    .venv/bin/python benchmarks/bench_reports.py fill "$STORE" --gpus 64 --days 30
    .venv/bin/python benchmarks/bench_reports.py time "$STORE"
    .venv/bin/python benchmarks/bench_reports.py check "$STORE"

At fleet scale (PostgreSQL from ``bench_store.py start``): ``fill`` a few template nodes, one
process per node (``--gpus 8 --first-node N --no-maintenance``), then ``prune`` and ``pack``
once all are written, then ``replicate URL --templates 2 --nodes 1000`` copies them by SQL to
nodes 2 to 999 (``store_replica.py``), then ``blocks`` makes waste's idle blocks of the whole
fleet's days, as the daemons would.

``fill`` writes every node's cycles in time order through ``TableStore.publish`` (one
transaction per cycle with its rollups, raw rows kept 14 days by the writer's retention, as a
daemon run with the defaults does), at a 300 s store interval. The cluster churns: each GPU (or
MIG instance: every fourth node splits GPU 0 into two) runs a sequence of pods of changing
workloads, each pod living 1 to 8 hours (restarts several times a day), separated by idle gaps
of random length (some with the pod still holding memory); one pod in ten holds its GPU without
using it; SM and DRAM activity and the peaks vary from window to window; each pod's usage is
reported as the daemon reports it (``pod_usage``). Seeded: the same arguments give the same
store.

``time`` runs each ``--by`` view in table, JSON and CSV for ``--since 30d`` and ``24h`` as a
whole ``gpu-profiler`` process (its sources byte-compiled, as installed), three times; it prints
the median wall time, the largest peak RSS and the median CPU time, after the start-up of
``--help`` and of each command's ``--help``.
``check`` runs every view over a range inside the raw rows' retention and compares a sample of
nodes, their GPUs and pods, and of workloads with ``check_views.py``'s own SQL over the raw
rows; it prints the largest difference per figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler_app.core.durations import parse_duration  # noqa: E402
from profiler_app.core.model import (  # noqa: E402
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    SM_ACTIVE,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodUsage,
)
from profiler_app.reports.rightsizing.profiles import H100_SXM5_80GB  # noqa: E402
from profiler_app.sinks.store import TableStore, dbapi  # noqa: E402
from profiler_app.sinks.store.dbapi import Database  # noqa: E402
from profiler_app.sinks.store.engine import sqlalchemy_url  # noqa: E402
from profiler_app.sinks.store.idle_blocks import IdleBlocks  # noqa: E402
from profiler_app.sinks.store.packing import Packing  # noqa: E402
from profiler_app.sinks.store.retention import Retention  # noqa: E402
from profiler_app.sinks.store.sink import StoreError  # noqa: E402
from profiler_app.sinks.store.urls import parse_store_url  # noqa: E402

END = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
INTERVAL = 300.0
WINDOW = 1800.0
VIEWS = ("node", "gpu", "pod", "idle-pods", "waste", "trace", "trial", "rightsize")
FORMATS = ("table", "json", "csv")
RANGES = ("30d", "24h")
COMMANDS = ("run", "analyze", "report", "trace", "trial", "completion", "unprotect", "demo")
H100 = "NVIDIA H100 80GB HBM3"
MIG_PROFILE = "3g.40gb"  # every fourth node splits GPU 0 into two of these


# Every name that says which node a row came from holds one of these tokens, so that
# ``store_replica`` can copy a node's rows to another node by replacing them: node names, GPU
# UUIDs, pod names, and workloads (shared by the nodes of a group, as a job's pods spread).
NODES_PER_GROUP = 25


def node_name(node: int) -> str:
    return f"node-{node:04d}"


def uuid_token(node: int) -> str:
    return f"GPU-{node:08x}-"


def pod_token(node: int) -> str:
    return f"-n{node:04d}-"


def group_token(node: int) -> str:
    return f"-g{node // NODES_PER_GROUP:03d}"


def tokens(node: int) -> tuple[str, ...]:
    return node_name(node), uuid_token(node), pod_token(node), group_token(node)


class Slot:
    """One GPU or MIG instance and what runs on it: a pod for a while, then a gap."""

    def __init__(self, rng: random.Random, node: int, gpu: int, instance: str) -> None:
        self.rng, self.node, self.gpu, self.instance = rng, node, gpu, instance
        model = H100_SXM5_80GB.profile(MIG_PROFILE) if instance else H100_SXM5_80GB
        assert model is not None
        self.memory_mib = model.memory_gib * 1024
        self.until = END - timedelta(days=400)  # start with a new pod
        self.pod: tuple[str, str, str, str] | None = None
        self.level = 0.0
        self.serial = 0
        self.started = self.until

    def next(self, at: datetime) -> None:
        """A new pod (restarted or another workload) or an idle gap, when the current ends."""
        if at < self.until:
            return
        rng = self.rng
        self.serial += 1
        if self.pod is not None and rng.random() < 0.35:  # an idle gap
            self.pod = None if rng.random() < 0.7 else self.pod
            self.level = 0.0
            self.until = at + timedelta(minutes=rng.randint(5, 300))
            return
        workload = rng.randrange(400)
        kind = ("PyTorchJob", "Deployment", "Job")[workload % 3]
        owner = f"w{workload}{group_token(self.node)}"
        self.pod = (
            f"team-{workload % 25}",
            f"{owner}{pod_token(self.node)}{self.serial}-{self.gpu}{self.instance}",
            kind,
            owner,
        )
        # One pod in ten holds its GPU without using it (report --by idle-pods).
        self.level = 0.0 if rng.random() < 0.1 else rng.uniform(0.05, 0.95)
        self.started = at
        self.until = at + timedelta(minutes=rng.randint(60, 480))

    def profile(self, at: datetime) -> GpuProfile:
        rng = self.rng
        self.next(at)
        active = self.pod is not None and self.level > 0
        sm = min(max(self.level + rng.gauss(0, 0.08), 0.0), 1.0) if active else 0.0
        util = min(100.0, sm * 100 + rng.uniform(0, 10)) if active else rng.uniform(0, 2)
        # A pod's framebuffer peak, at most what its GPU or MIG instance holds.
        fb = min(rng.uniform(2_000, 70_000) * (0.5 + self.level), self.memory_mib)
        fb = fb if self.pod else 300.0
        stats = {
            GPU_UTIL: FieldStats(util, util * 0.95, util * 0.7, 0.05 if active else 1.0),
            MEM_COPY_UTIL: FieldStats(util / 2, util / 2.2, util / 4, 0.0),
            FB_USED: FieldStats(fb, fb, fb * 0.9, 0.0),
            SM_ACTIVE: FieldStats(sm, sm, sm * 0.8, 0.0),
            DRAM_ACTIVE: FieldStats(sm / 2, sm / 2, sm / 3, 0.0),
        }
        namespace, pod, owner_kind, owner_name = self.pod or (None, None, None, None)
        training = active and owner_kind == "PyTorchJob"
        return GpuProfile(
            str(self.gpu),
            f"{uuid_token(self.node)}{self.gpu:04x}-4000-8000-000000000000",
            node_name(self.node),
            ("training" if training else "inference") if active else "idle",
            120.0 if training else None,
            stats,
            namespace=namespace,
            pod=pod,
            owner_kind=owner_kind,
            owner_name=owner_name,
            mig_instance=self.instance,
            mig_profile=MIG_PROFILE if self.instance else "",
            gpu_model=H100,
        )

    def usage(self, at: datetime, profile: GpuProfile) -> PodUsage | None:
        """The pod's peaks in this cycle, as the daemon reports a pod holding GPUs."""
        if profile.pod is None or profile.namespace is None:
            return None
        util = profile.stats[GPU_UTIL].max if self.level > 0 else 0.0
        return PodUsage(
            profile.namespace,
            profile.pod,
            node_name(self.node),
            self.started,
            (profile.gpu,),
            util,
            profile.stats[MEM_COPY_UTIL].max,
            profile.stats[FB_USED].max,
            cpu_util_max=self.rng.uniform(20, 400),
            mem_used_max_bytes=self.rng.uniform(4e9, 64e9),
            first_seen=max(self.started, at - timedelta(seconds=WINDOW)),
            last_seen=at,
            owner_kind=profile.owner_kind,
            owner_name=profile.owner_name,
        )


def slots_of(node: int, rng: random.Random) -> list[Slot]:
    slots = []
    for gpu in range(8):
        instances = ("1", "2") if node % 4 == 0 and gpu == 0 else ("",)
        slots += [Slot(rng, node, gpu, instance) for instance in instances]
    return slots


def _without_fsync(connection: Any) -> None:
    """WAL without an fsync per commit: a month of commits in minutes. The fill is not what is
    timed (the writers benchmark measures durable commits); what it writes is the same."""
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=OFF")


def writer(url: str, raw_days: int) -> TableStore:
    """The daemon's writer with the defaults' retention, and SQLite without an fsync per
    commit."""
    dbapi.prepare_sqlite_writer = _without_fsync
    return TableStore(
        url,
        retention_seconds=raw_days * 86400.0,
        rollup_retention_seconds=400 * 86400.0,
        store_interval_seconds=INTERVAL,
    )


def write(store: TableStore, nodes: dict[int, list[Slot]], days: float) -> tuple[int, int]:
    """Every node's cycles over the ``days`` before ``END``, in time order; the cycles, and
    those that failed (the store keeps a failed cycle and writes it with the node's next one,
    as a daemon's store does; the daemon logs the error and goes on)."""
    start = END - timedelta(days=days)
    steps = int(days * 86400 / INTERVAL)
    began = time.monotonic()
    failed = 0
    for step in range(1, steps + 1):
        at = start + timedelta(seconds=step * INTERVAL)
        for node, slots in nodes.items():
            profiles = [slot.profile(at) for slot in slots]
            pods = [slot.usage(at, profile) for slot, profile in zip(slots, profiles, strict=True)]
            usage = [pod for pod in pods if pod is not None]
            try:
                store.publish(CycleResult(node_name(node), at, WINDOW, profiles, usage))
            except StoreError as error:
                failed += 1
                print(f"  {node_name(node)} at {at:%Y-%m-%d %H:%M}: {error}", flush=True)
        if step % 288 == 0:
            print(f"  day {step // 288} written, {time.monotonic() - began:.0f} s", flush=True)
    return steps * len(nodes), failed


def fill(
    url: str, gpus: int, days: int, raw_days: int, first_node: int = 0, *, maintain: bool = True
) -> None:
    """``gpus // 8`` nodes from ``first_node`` on; then retention, packing and idle blocks at
    ``END`` unless ``maintain`` is False (parallel fills: run ``prune``, ``pack`` and ``blocks``
    once all are done, since packing at ``END`` while another fill still writes earlier hours
    is what no daemon does)."""
    store = writer(url, raw_days)
    nodes = {
        node: slots_of(node, random.Random(node))
        for node in range(first_node, first_node + gpus // 8)
    }
    began = time.monotonic()
    cycles, failed = write(store, nodes, days)
    store.close()
    print(f"{cycles:,} cycles in {time.monotonic() - began:.0f} s, {failed} failed and retried")
    if maintain:
        prune(url, raw_days)
        pack(url)
        make_blocks(url)


def pack(url: str, now: datetime = END) -> None:
    """The writer's packing (``packing.py``) of every bucket complete at ``now``, as the
    daemons run it every quarter of an hour; the histogram tables' rows before and after."""
    database = Database(parse_store_url(url))
    tables = ("activity_hour", "activity_day", "activity_hour_packed", "activity_day_packed")
    count = "SELECT " + ", ".join(f"(SELECT count(*) FROM {table})" for table in tables)
    print("rows before:", dict(zip(tables, database.query(count)[0], strict=True)))
    packing = Packing(every=0)
    began = time.monotonic()
    while packing.pack(database, now):
        pass
    print(f"packed in {time.monotonic() - began:.1f} s")
    print("rows after: ", dict(zip(tables, database.query(count)[0], strict=True)))
    database.close()


def make_blocks(url: str, now: datetime = END) -> None:
    """The writer's idle blocks (``idle_blocks.py``) of every settled day at ``now``, as the
    daemons make them every quarter of an hour, all at once."""
    database = Database(parse_store_url(url))
    began = time.monotonic()
    made = IdleBlocks(every=0, limit=100_000).make(database, now)
    print(f"{made} idle blocks made in {time.monotonic() - began:.1f} s")
    for table in ("idle_block", "idle_block_gpu"):
        for days, count in database.query(
            f"SELECT days, count(*) FROM {table} GROUP BY days ORDER BY days"
        ):
            print(f"  {table} {days:>2}-day blocks: {count:,} rows")
    database.close()


def prune(url: str, raw_days: int) -> None:
    """Retention as the daemons run it at ``END`` (hourly; a fill runs faster than the hour)."""
    database = Database(parse_store_url(url))
    retention = Retention(raw_days * 86400.0, 400 * 86400.0)
    while retention.prune(database, END):
        pass
    database.close()


@functools.cache
def _cli_environment() -> dict[str, str]:
    """The environment of a timed ``gpu-profiler``, with its sources byte-compiled once (into
    their ``__pycache__``, which git ignores) as ``pip install`` compiles the installed package,
    the image's case. Where ``PYTHONDONTWRITEBYTECODE`` is set, as on the machine these figures
    were first taken on, every run compiled the sources again (benchmarks/RESULTS.md,
    2026-11-30: command ``--help`` 0.15-0.18 s before, 0.13-0.16 s after)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "profiler_app")],
        check=True,
        env=environment,
    )
    return environment


def _run(arguments: list[str]) -> tuple[float, int, int, float]:
    """(seconds, peak RSS in KiB, exit status, CPU seconds) of one whole gpu-profiler process:
    on a shared machine the wall time includes waiting for a core, the CPU time does not."""
    environment = _cli_environment()
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "profiler_app", *arguments],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment,
    )
    _, status, usage = os.wait4(process.pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    return time.monotonic() - began, usage.ru_maxrss, os.waitstatus_to_exitcode(status), cpu


def time_views(
    url: str, rounds: int, views: list[str], start_up: bool = True, until: datetime = END
) -> None:
    until_text = until.isoformat().replace("+00:00", "Z")
    results = {}
    for command in (["--help"], *([name, "--help"] for name in COMMANDS)) if start_up else ():
        seconds = statistics.median(_run(command)[0] for _ in range(rounds))
        print(f"start-up {' '.join(command):<16} {seconds:.2f} s", flush=True)
    for since in RANGES:
        for view in views:
            for output in FORMATS:
                runs = [
                    _run(
                        [
                            "report",
                            "--store-url",
                            url,
                            "--by",
                            view,
                            "--since",
                            since,
                            "--until",
                            until_text,
                            "-o",
                            output,
                        ]
                    )
                    for _ in range(rounds)
                ]
                if any(run[2] != 0 for run in runs):
                    print(f"{since} {view} {output}: failed", flush=True)
                    continue
                seconds = statistics.median(run[0] for run in runs)
                memory = max(run[1] for run in runs) / 1024
                cpu = statistics.median(run[3] for run in runs)
                results[f"{since} {view} {output}"] = (seconds, memory, cpu)
                print(
                    f"{since:>4} {view:<10} {output:<6} {seconds:6.2f} s {memory:6.0f} MiB"
                    f" {cpu:6.2f} s CPU",
                    flush=True,
                )
    print(json.dumps(results))


def cli_report(url: str, since: str, until: datetime = END) -> Callable[[str], list[Any]]:
    """A view's JSON rows from a whole ``gpu-profiler report`` process (every pod: --top 0)."""

    def report(view: str) -> list[Any]:
        arguments = ["report", "--store-url", url, "--by", view, "--since", since]
        arguments += ["--until", until.isoformat(), "--top", "0", "-o", "json"]
        out = subprocess.run(
            [sys.executable, "-m", "profiler_app", *arguments],
            capture_output=True,
            text=True,
            check=True,
            env=_cli_environment(),
        ).stdout
        rows: list[Any] = json.loads(out)["rows"]
        return rows

    return report


def check(url: str, sample: int, since: str) -> None:
    """Every view for a sample against ``check_views``' SQL over the raw rows."""
    import sqlalchemy as sa  # noqa: PLC0415

    from benchmarks.check_views import check as check_views  # noqa: PLC0415

    window = timedelta(seconds=parse_duration(since))
    engine = sa.create_engine(sqlalchemy_url(parse_store_url(url)))
    with engine.connect() as connection:
        differences = check_views(connection, cli_report(url, since), END - window, END, sample)
    engine.dispose()
    for name in sorted(differences.compared.keys() | differences.largest.keys()):
        largest = differences.largest.get(name)
        print(
            f"{name:<52} {differences.compared.get(name, 0):>7} compared"
            + ("" if largest is None else f", largest difference {largest:.3g}")
        )


def replicate(url: str, templates: int, nodes: int, first: int) -> None:
    """Nodes ``first`` to ``nodes - 1`` copied from template ``node % templates`` by SQL.

    The templates (nodes 0 to ``templates - 1``, one group) are copied as whole groups: nodes
    ``k * templates`` to ``(k + 1) * templates - 1`` form copy group ``k``, whose workloads are
    the templates' renamed (right-sizing's rollups merge a workload's nodes)."""
    from benchmarks.store_replica import copy_nodes, describe  # noqa: PLC0415

    if templates > NODES_PER_GROUP or first % templates:
        raise SystemExit(
            f"--templates must be at most {NODES_PER_GROUP} and --first a multiple of it"
        )
    began = time.monotonic()
    copies = [
        (tokens(node % templates), (*tokens(node)[:-1], f"-c{node // templates:04d}"))
        for node in range(first, nodes)
    ]
    written = copy_nodes(url, copies)
    seconds = time.monotonic() - began
    print(f"{len(copies)} nodes copied, {sum(written.values()):,} rows in {seconds:.0f} s")
    describe(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    filling = commands.add_parser("fill")
    filling.add_argument("url")
    filling.add_argument("--gpus", type=int, default=256)
    filling.add_argument("--days", type=int, default=30)
    filling.add_argument("--raw-days", type=int, default=14)
    filling.add_argument(
        "--first-node", type=int, default=0, help="number nodes from here (parallel fills)"
    )
    filling.add_argument(
        "--no-maintenance",
        action="store_true",
        help="no retention or packing at the end (parallel fills: prune and pack after all)",
    )
    timing = commands.add_parser("time")
    timing.add_argument("url")
    timing.add_argument("--rounds", type=int, default=3)
    timing.add_argument("--views", default=",".join(VIEWS))
    timing.add_argument("--no-start-up", action="store_true", help="only the report views")
    timing.add_argument(
        "--until", type=datetime.fromisoformat, default=END, help="the reports' end (default: END)"
    )
    pruning = commands.add_parser("prune")
    pruning.add_argument("url")
    pruning.add_argument("--raw-days", type=int, default=14)
    packing = commands.add_parser("pack", help="the writer's packing of complete buckets")
    packing.add_argument("url")
    packing.add_argument("--now", type=datetime.fromisoformat, default=END)
    blocking = commands.add_parser("blocks", help="the writer's idle blocks of settled days")
    blocking.add_argument("url")
    blocking.add_argument("--now", type=datetime.fromisoformat, default=END)
    checking = commands.add_parser("check")
    checking.add_argument("url")
    checking.add_argument("--sample", type=int, default=20)
    checking.add_argument("--since", default="2d", help="inside the raw rows' retention")
    copying = commands.add_parser("replicate", help="copy template nodes to a fleet by SQL")
    copying.add_argument("url")
    copying.add_argument("--templates", type=int, default=2, help="nodes 0 to N-1")
    copying.add_argument("--nodes", type=int, default=1000, help="nodes in the store after")
    copying.add_argument("--first", type=int, default=None, help="first node to write")
    args = parser.parse_args()
    if args.command == "fill":
        fill(
            args.url,
            args.gpus,
            args.days,
            args.raw_days,
            args.first_node,
            maintain=not args.no_maintenance,
        )
    elif args.command == "replicate":
        first = args.templates if args.first is None else args.first
        replicate(args.url, args.templates, args.nodes, first)
    elif args.command == "pack":
        pack(args.url, args.now)
    elif args.command == "blocks":
        make_blocks(args.url, args.now)
    elif args.command == "prune":
        prune(args.url, args.raw_days)
    elif args.command == "time":
        time_views(args.url, args.rounds, args.views.split(","), not args.no_start_up, args.until)
    else:
        check(args.url, args.sample, args.since)


if __name__ == "__main__":
    main()
