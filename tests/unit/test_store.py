"""The table store writing cycles on SQLite and on a real PostgreSQL (``integration``, see
tests/support): GPU windows with their statistics, the time each row covers, pods upserted to
their peaks, and cycles written whole or not at all (failures, SIGKILL, a lost commit answer).

Its schema and migrations are tested in test_store_schema.py, its URLs in test_store_urls.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from profiler_app.core.model import GPU_UTIL, FieldStats, GpuProfile, PodUsage
from profiler_app.sinks.store import StoreError, TableStore
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.models import gpu_window, pod_usage
from profiler_app.sinks.store.sink import _gpu_window_row
from tests.support.store_cycles import T0, WINDOW, cycle, engine_for, fetch, pod, profile

pytest_plugins = ["tests.support.postgres"]


def test_times_are_stored_as_sqlalchemy_stores_them(store: TableStore, store_url: str) -> None:
    """Rows from the daemon and from SQLAlchemy (report, trace) compare and sort alike."""
    at = T0 + timedelta(seconds=30)
    whole_second = T0 + timedelta(minutes=1)
    store.publish(cycle(at, [profile("0")]))
    store.publish(cycle(whole_second, [profile("0")]))
    engine = engine_for(store_url)
    with engine.begin() as connection:
        for when in (at, whole_second):
            connection.execute(
                sa.insert(gpu_window),
                [_gpu_window_row(cycle(when, [profile("1")]), profile("1"), None)],
            )
        stored = connection.execute(
            sa.text("SELECT gpu, CAST(at AS TEXT) FROM gpu_window ORDER BY at, gpu")
        ).all()
        read_back = connection.execute(sa.select(gpu_window.c.at).order_by(gpu_window.c.at)).all()
    engine.dispose()
    by_gpu = {gpu: [text for g, text in stored if g == gpu] for gpu in ("0", "1")}
    assert by_gpu["0"] == by_gpu["1"]  # the same text (SQLite) or timestamptz (PostgreSQL)
    assert [row[0] for row in read_back] == [at, at, whole_second, whole_second]


def test_gpu_windows_are_written_with_their_statistics(store: TableStore, store_url: str) -> None:
    store.publish(cycle(T0, [profile("0"), profile("1", "idle", 1.0)]))
    rows = fetch(
        store_url,
        "SELECT gpu, uuid, job_type, period_seconds, window_seconds, util_max, util_p95, "
        "util_mean, util_idle_fraction, mem_copy_util_max, fb_used_max_mib, namespace, pod "
        "FROM gpu_window ORDER BY gpu",
    )
    assert [tuple(row) for row in rows] == [
        (
            "0",
            "GPU-0",
            "training",
            12.5,
            WINDOW,
            90.0,
            85.0,
            50.0,
            0.25,
            40.0,
            2048.0,
            "ml",
            "train-0",
        ),
        ("1", "GPU-1", "idle", None, WINDOW, 1.0, -4.0, 50.0, 0.25, 40.0, 2048.0, "ml", "train-0"),
    ]
    evidence = fetch(
        store_url,
        "SELECT confidence, basis, reasons, owner_kind, owner_name FROM gpu_window WHERE gpu = '0'",
    )
    assert [tuple(row) for row in evidence] == [
        (0.8, "util-loop", "period 12s in util; owner PyTorchJob", "PyTorchJob", "llama")
    ]
    running = fetch(store_url, "SELECT gpu, engine, framework FROM gpu_window ORDER BY gpu")
    assert [tuple(row) for row in running] == [("0", "torchrun", "pytorch"), ("1", None, None)]


def test_missing_statistics_are_stored_as_null(store: TableStore, store_url: str) -> None:
    no_samples = FieldStats(max=math.nan, p95=math.nan, mean=math.nan, idle_fraction=math.nan)
    bare = GpuProfile(
        gpu="0",
        uuid="GPU-0",
        hostname="node-a",
        job_type="idle",
        period_seconds=None,
        stats={GPU_UTIL: no_samples},
    )
    store.publish(cycle(T0, [bare]))
    assert fetch(
        store_url,
        "SELECT util_max, util_idle_fraction, mem_copy_util_max, namespace, confidence, reasons"
        " FROM gpu_window",
    ) == [(None, None, None, None, None, None)]


def test_covers_seconds_follow_the_gaps_between_rows(store_url: str) -> None:
    first = TableStore(store_url)
    first.publish(cycle(T0, [profile("0")]))
    first.publish(cycle(T0 + timedelta(seconds=30), [profile("0")]))
    first.publish(cycle(T0 + timedelta(hours=2), [profile("0"), profile("1")]))  # gap > window
    first.close()
    restarted = TableStore(store_url)  # a restarted daemon continues from the stored rows
    restarted.publish(cycle(T0 + timedelta(hours=2, seconds=45), [profile("0"), profile("1")]))
    restarted.close()
    rows = fetch(store_url, "SELECT gpu, covers_seconds FROM gpu_window ORDER BY at, gpu")
    assert [tuple(row) for row in rows] == [
        ("0", WINDOW),
        ("0", 30.0),
        ("0", WINDOW),
        ("1", WINDOW),
        ("0", 45.0),
        ("1", 45.0),
    ]


def test_pod_upsert_keeps_the_maximum_of_each_resource(store: TableStore, store_url: str) -> None:
    store.publish(
        cycle(T0, [], [pod(gpu_util_max=80.0, cpu_util_max=None, mem_used_max_bytes=5e9)])
    )
    store.publish(
        cycle(
            T0 + timedelta(minutes=1),
            [],
            [
                pod(
                    gpu_util_max=20.0,
                    cpu_util_max=150.0,
                    mem_used_max_bytes=None,
                    fb_used_max_mib=9.0,
                )
            ],
        )
    )
    store.publish(cycle(T0 + timedelta(minutes=2), [], [pod(gpu_util_max=95.0, cpu_util_max=50.0)]))
    rows = fetch(
        store_url,
        "SELECT gpu_util_max, cpu_util_max, mem_used_max_bytes, fb_used_max_mib, "
        "gpu_mem_copy_util_max, gpus, gpu_count FROM pod_usage",
    )
    assert [tuple(row) for row in rows] == [(95.0, 150.0, 5e9, 9.0, None, "0", 1)]
    engine = engine_for(store_url)
    with engine.connect() as connection:
        seen = connection.execute(sa.select(pod_usage.c.first_seen, pod_usage.c.last_seen)).one()
    engine.dispose()
    assert tuple(seen) == (T0, T0 + timedelta(minutes=2))


def test_a_pod_keeps_its_gpus_when_they_left_the_window_and_its_times_come_from_its_samples(
    store: TableStore, store_url: str
) -> None:
    """A pod whose GPU samples ended at 00:10 is written with its last sample as the end of its
    life, not the cycle's time; a later cycle that sees it holding no GPU (still running, its
    series gone) keeps the GPUs it had, so it stays in ``report --by pod``."""
    ended = T0 + timedelta(minutes=10)
    store.publish(cycle(T0 + timedelta(minutes=5), [], [pod(owner_kind="Job", owner_name="eval")]))
    finished = PodUsage("ml", "train-0", "node-a", T0, gpus=("0",), first_seen=T0, last_seen=ended)
    store.publish(cycle(T0 + timedelta(minutes=20), [], [finished]))

    def seen() -> tuple[datetime, datetime]:
        engine = engine_for(store_url)
        with engine.connect() as connection:
            row = connection.execute(sa.select(pod_usage.c.first_seen, pod_usage.c.last_seen))
            first, last = row.one()
        engine.dispose()
        return first, last

    assert seen() == (T0, ended)
    store.publish(
        cycle(T0 + timedelta(minutes=21), [], [PodUsage("ml", "train-0", "node-a", T0, gpus=())])
    )
    rows = fetch(store_url, "SELECT gpus, gpu_count, owner_kind, owner_name FROM pod_usage")
    assert [tuple(row) for row in rows] == [("0", 1, "Job", "eval")]
    assert seen() == (T0, T0 + timedelta(minutes=21))


def test_pods_are_keyed_by_start_time_and_unknown_start_is_one_row(
    store: TableStore, store_url: str
) -> None:
    restarted_pod = pod(start=T0 + timedelta(hours=1), gpu_util_max=1.0)
    for minute in range(3):
        at = T0 + timedelta(hours=2, minutes=minute)
        store.publish(
            cycle(at, [], [pod(gpu_util_max=10.0), restarted_pod, pod("anon", start=None)])
        )
    rows = fetch(store_url, "SELECT pod, gpu_util_max FROM pod_usage ORDER BY pod, gpu_util_max")
    assert [tuple(row) for row in rows] == [("anon", None), ("train-0", 1.0), ("train-0", 10.0)]


def test_duplicate_pods_in_one_cycle_are_merged(store: TableStore, store_url: str) -> None:
    store.publish(cycle(T0, [], [pod(gpu_util_max=10.0), pod(gpu_util_max=70.0, cpu_util_max=3.0)]))
    assert fetch(store_url, "SELECT gpu_util_max, cpu_util_max FROM pod_usage") == [(70.0, 3.0)]


def test_a_failure_mid_cycle_writes_nothing_of_that_cycle(
    store: TableStore, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.publish(cycle(T0, [profile("0")], [pod(gpu_util_max=10.0)]))
    original = TableStore._upsert_pods

    def upsert_then_fail(self: TableStore, *args: Any) -> None:
        original(self, *args)  # GPU rows and pod rows are written, then the cycle fails
        raise RuntimeError("injected failure before commit")

    monkeypatch.setattr(TableStore, "_upsert_pods", upsert_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        store.publish(cycle(T0 + timedelta(seconds=30), [profile("0")], [pod(gpu_util_max=99.0)]))
    monkeypatch.undo()
    assert fetch(store_url, "SELECT count(*) FROM gpu_window") == [(1,)]
    assert fetch(store_url, "SELECT gpu_util_max FROM pod_usage") == [(10.0,)]
    # The failed cycle did not advance the covered time: the next row covers since the last commit.
    store.publish(cycle(T0 + timedelta(seconds=60), [profile("0")]))
    assert fetch(
        store_url, "SELECT max(covers_seconds) FROM gpu_window WHERE covers_seconds < 1000"
    )[0] == (60.0,)


_CRASH_WRITER = textwrap.dedent(
    """
    import sys
    from datetime import UTC, datetime, timedelta
    from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile, PodUsage
    from profiler_app.sinks.store import TableStore

    url, first = sys.argv[1], int(sys.argv[2])
    store = TableStore(url)
    stats = {GPU_UTIL: FieldStats(max=50.0, p95=40.0, mean=30.0, idle_fraction=0.1)}
    for n in range(first, first + 100000):
        at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=30 * n)
        gpus = [GpuProfile(str(g), f"GPU-{g}", "node", "training", 1.0, stats) for g in range(32)]
        pods = [
            PodUsage("ml", f"pod-{p}", "node-a", None, (str(p % 32),), gpu_util_max=float(n))
            for p in range(48)
        ]
        store.publish(CycleResult("node-a", at, 1800.0, gpus, pods))
        print(n, flush=True)
    """
)


def stored_cycles(url: str) -> dict[int, int]:
    """Rows per cycle number (cycle n is at T0 + 30 s * n)."""
    engine = engine_for(url)
    with engine.connect() as connection:
        groups = connection.execute(
            sa.select(gpu_window.c.at, sa.func.count()).group_by(gpu_window.c.at)
        ).all()
    engine.dispose()
    return {round((at - T0).total_seconds() / 30): count for at, count in groups}


@pytest.mark.slow
def test_sigkill_mid_run_keeps_every_committed_cycle_whole(store_url: str) -> None:
    """A writer killed with SIGKILL at random moments: only whole cycles, none committed lost.

    Each cycle writes 32 GPU rows and upserts 48 pods whose peak is the cycle number, so the
    store must hold cycles 0..n-1 exactly, 32 rows each, and every pod's peak must be n-1.
    """
    rng = random.Random(7)
    printed: list[int] = []
    for _ in range(3):
        first = len(stored_cycles(store_url)) if printed else 0
        writer = subprocess.Popen(
            [sys.executable, "-c", _CRASH_WRITER, store_url, str(first)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path.cwd())},
        )
        assert writer.stdout is not None
        for _ in range(rng.randint(5, 15)):
            printed.append(int(writer.stdout.readline()))
        time.sleep(rng.uniform(0.0, 0.02))  # lands anywhere in a later cycle's transaction
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
    cycles = stored_cycles(store_url)
    assert set(cycles.values()) == {32}, "a cycle was half written"
    assert sorted(cycles) == list(range(len(cycles)))
    assert set(printed) <= set(cycles), "a committed cycle was lost"
    peaks = fetch(store_url, "SELECT gpu_util_max FROM pod_usage")
    assert len(peaks) == 48
    assert {value for (value,) in peaks} == {float(len(cycles) - 1)}
    if store_url.startswith("sqlite"):
        assert fetch(store_url, "PRAGMA integrity_check") == [("ok",)]


# -- Stored hours that stay true ----------------------------------------------------------------


def test_a_commit_whose_answer_was_lost_is_not_counted_twice(
    store: TableStore, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server committed the cycle but the connection broke before it said so: the next row
    must cover the time since that committed row, not since the one before it."""
    store.publish(cycle(T0, [profile("0")]))
    original = Database.transaction

    @contextlib.contextmanager
    def commit_then_lose_the_answer(self: Database) -> Iterator[Any]:
        with original(self) as cursor:
            yield cursor
        raise self.errors[0]("server closed the connection unexpectedly")

    monkeypatch.setattr(Database, "transaction", commit_then_lose_the_answer)
    with pytest.raises(StoreError, match="closed the connection"):
        store.publish(cycle(T0 + timedelta(seconds=30), [profile("0")]))
    monkeypatch.undo()
    store.publish(cycle(T0 + timedelta(seconds=60), [profile("0")]))

    rows = fetch(store_url, "SELECT covers_seconds FROM gpu_window ORDER BY at")
    assert [row[0] for row in rows] == [WINDOW, 30.0, 30.0]


def test_two_daemons_writing_one_node_count_each_moment_once(store_url: str) -> None:
    """During a rolling update (or beside a hand-started `run`), two processes write rows for
    the same GPU: together they must cover the elapsed time once."""
    old, new = TableStore(store_url), TableStore(store_url)
    for seconds, writer in ((0, old), (10, new), (30, old), (40, new), (60, old), (70, new)):
        writer.publish(cycle(T0 + timedelta(seconds=seconds), [profile("0")]))
    old.close()
    new.close()

    rows = fetch(store_url, "SELECT covers_seconds FROM gpu_window ORDER BY at")
    assert [row[0] for row in rows] == [WINDOW, 10.0, 20.0, 10.0, 20.0, 10.0]
