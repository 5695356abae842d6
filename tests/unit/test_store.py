"""The table store on SQLite and on a real PostgreSQL (``integration``, see tests/support)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from profiler_app.errors import UserError
from profiler_app.model import (
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodUsage,
)
from profiler_app.sinks.store import StoreError, TableStore, default_store_url
from profiler_app.sinks.store.dbapi import Database
from profiler_app.sinks.store.engine import alembic_config, create_store_engine, head_revisions
from profiler_app.sinks.store.models import gpu_window, metadata, pod_usage
from profiler_app.sinks.store.partitions import is_partition
from profiler_app.sinks.store.schema import SCHEMA_HEAD
from profiler_app.sinks.store.sink import _PEAK_COLUMNS, _POD_KEY, _gpu_window_row, _pod_row
from profiler_app.sinks.store.urls import parse_store_url

pytest_plugins = ["tests.support.postgres"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = 1800.0


def profile(gpu: str, job_type: str = "training", util_max: float = 90.0) -> GpuProfile:
    return GpuProfile(
        gpu=gpu,
        uuid=f"GPU-{gpu}",
        hostname="node-a",
        job_type=job_type,
        period_seconds=12.5 if job_type == "training" else None,
        stats={
            GPU_UTIL: FieldStats(max=util_max, p95=util_max - 5, mean=50.0, idle_fraction=0.25),
            MEM_COPY_UTIL: FieldStats(max=40.0, p95=35.0, mean=20.0, idle_fraction=0.5),
            FB_USED: FieldStats(max=2048.0, p95=2000.0, mean=1500.0, idle_fraction=0.0),
        },
        namespace="ml",
        pod="train-0",
        confidence=0.8,
        reasons=("period 12s in util", "owner PyTorchJob"),
        basis="util-loop",
        owner_kind="PyTorchJob",
        owner_name="llama",
        engine="torchrun" if job_type == "training" else None,
        framework="pytorch" if job_type == "training" else None,
    )


def pod(name: str = "train-0", start: datetime | None = T0, **peaks: float | None) -> PodUsage:
    return PodUsage(namespace="ml", pod=name, node="node-a", start_time=start, gpus=("0",), **peaks)


def cycle(at: datetime, gpus: list[GpuProfile], pods: list[PodUsage] | None = None) -> CycleResult:
    return CycleResult(node="node-a", at=at, window_seconds=WINDOW, gpus=gpus, pods=pods or [])


def engine_for(url: str) -> sa.Engine:
    return create_store_engine(parse_store_url(url), create_file=False)


def fetch(url: str, query: str) -> list[Any]:
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text(query)).all())
    finally:
        engine.dispose()


@pytest.fixture
def store(store_url: str) -> Any:
    sink = TableStore(store_url)
    yield sink
    sink.close()


def test_migration_matches_models_and_reaches_head(store: TableStore, store_url: str) -> None:
    engine = engine_for(store_url)
    with engine.connect() as connection:
        # The partitions the writer makes (PostgreSQL) are not the models'.
        context = MigrationContext.configure(
            connection,
            opts={
                "include_name": lambda name, kind, _: not (kind == "table" and is_partition(name))
            },
        )
        assert set(context.get_current_heads()) == set(head_revisions())
        diff = compare_metadata(context, metadata)
        indexes = sa.inspect(connection).get_indexes("gpu_window")
    engine.dispose()
    assert diff == []
    assert {tuple(index["column_names"]) for index in indexes} == {("at",), ("node", "gpu", "at")}
    TableStore(store_url).close()  # opening an up-to-date store again migrates nothing


def test_schema_head_is_alembics_head() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_heads() == [SCHEMA_HEAD]


def test_the_daemons_store_never_loads_sqlalchemy_or_alembic(store_url: str) -> None:
    """The daemon's memory: it writes through the DB-API driver, and a store behind is migrated
    by a child process (new processes here)."""
    probe = (
        "import sys; from profiler_app.sinks.store import TableStore; "
        f"TableStore({store_url!r}, migrate_in_child=True).close(); print(sorted(m for m in "
        "sys.modules if m.partition('.')[0] in ('alembic', 'sqlalchemy')))"
    )
    for _ in ("a new store, migrated", "the store at head"):
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )
        assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "[]", "")
        engine = engine_for(store_url)
        with engine.connect() as connection:
            assert MigrationContext.configure(connection).get_current_heads() == (SCHEMA_HEAD,)
        engine.dispose()


def test_the_writers_columns_are_the_tables_columns() -> None:
    """The DB-API writer names its columns by the rows it builds; the tables are models.py's."""
    window = _gpu_window_row(cycle(T0, [profile("0")]), profile("0"), None)
    usage = _pod_row(pod(), T0)
    for row, table in ((window, gpu_window), (usage, pod_usage)):
        required = {column.name for column in table.columns if not column.nullable} - {"id"}
        assert required <= set(row) <= set(table.columns.keys())
    assert set(_PEAK_COLUMNS) | set(_POD_KEY) <= set(pod_usage.columns.keys())


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


def test_a_migration_in_a_child_process_reports_a_newer_schema(
    store: TableStore, store_url: str
) -> None:
    engine = engine_for(store_url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(UserError, match="has a schema this gpu-profiler does not know"):
        TableStore(store_url, migrate_in_child=True)


def test_migrations_downgrade_and_upgrade_again(store: TableStore, store_url: str) -> None:
    engine = engine_for(store_url)
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
    with engine.connect() as connection:
        assert set(sa.inspect(connection).get_table_names()) == {"alembic_version"}
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with engine.connect() as connection:
        assert {"gpu_window", "pod_usage"} <= set(sa.inspect(connection).get_table_names())
    engine.dispose()


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


def test_migration_0003_keeps_memory_copy_values(store_url: str) -> None:
    """A store written before revision 0003 keeps its memory-copy values under the new names."""
    config = alembic_config()
    raw = create_store_engine(parse_store_url(store_url), create_file=True)
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
        connection.execute(
            sa.text(
                "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, window_seconds,"
                " covers_seconds, mem_util_max) VALUES (:at, 'n', '0', 'u', 'idle', 60, 60, 42)"
            ),
            {"at": T0.replace(tzinfo=None)},
        )
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with raw.connect() as connection:
        rows = connection.execute(sa.text("SELECT mem_copy_util_max, confidence FROM gpu_window"))
        assert [tuple(row) for row in rows] == [(42.0, None)]
    raw.dispose()


def test_the_engine_revision_adds_empty_columns_to_rows_written_before(store_url: str) -> None:
    """Rows written at revision 0003 keep everything and read NULL for engine and framework;
    downgrading drops the two columns again."""
    config = alembic_config()
    raw = create_store_engine(parse_store_url(store_url), create_file=True)
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")
        connection.execute(
            sa.text(
                "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, window_seconds,"
                " covers_seconds, basis) VALUES (:at, 'n', '0', 'u', 'idle', 60, 60, 'idle')"
            ),
            {"at": T0.replace(tzinfo=None)},
        )
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with raw.connect() as connection:
        rows = connection.execute(sa.text("SELECT basis, engine, framework FROM gpu_window"))
        assert [tuple(row) for row in rows] == [("idle", None, None)]
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
    with raw.connect() as connection:
        columns = {column["name"] for column in sa.inspect(connection).get_columns("gpu_window")}
        assert "engine" not in columns
        assert "basis" in columns
    raw.dispose()


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
    from profiler_app.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile, PodUsage
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


def test_default_url_is_a_sqlite_file_in_the_user_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = default_store_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'gpu-profiler' / 'profiler.db'}"
    TableStore(url).close()  # creates the parents
    assert (tmp_path / "data" / "gpu-profiler" / "profiler.db").is_file()
    assert fetch(url, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "malformed store URL"),
        ("mysql://u@h/db", "unsupported store URL scheme 'mysql'"),
        ("sqlite://", "needs a file"),
        ("sqlite:///:memory:", "needs a file"),
        ("sqlite:///profiler.db?mode=ro", "malformed SQLite store URL"),
        ("postgresql://u:hunter2@h:99999/db", "malformed store URL"),
        ("postgresql+asyncpg://u@h/db", "unsupported PostgreSQL driver"),
        ("postgresql://u:hunter2@127.0.0.1:5/", "names no database"),
    ],
)
def test_bad_urls_are_one_line_errors_without_passwords(url: str, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        TableStore(url)
    assert "hunter2" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_plain_postgresql_urls_use_psycopg() -> None:
    parsed = parse_store_url("postgresql://profiler:s3cret@db.example:5432/profiler")
    assert parsed.backend == "postgresql"
    assert parse_store_url("postgres://u@h/d").backend == "postgresql"
    assert parse_store_url("postgresql+psycopg://u@h/d").backend == "postgresql"


def test_displayed_postgresql_urls_mask_every_password() -> None:
    """libpq also takes a password (or an SSL key's) as an option in the query string."""
    parsed = parse_store_url(
        "postgresql://profiler:s3cret@db:5432/gpus?sslpassword=k3y&password=hunter2&sslmode=require"
    )
    shown = parsed.display()
    assert shown == (
        "postgresql://profiler:***@db:5432/gpus?sslpassword=***&password=***&sslmode=require"
    )
    assert parsed.query["password"] == "hunter2"  # masked only for display
    with pytest.raises(UserError, match="malformed store URL") as caught:
        parse_store_url("postgresql://u:s3cret@h:99999/db?password=hunter2")
    assert "s3cret" not in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_sqlite_in_an_unwritable_place_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match="cannot create the store directory"):
        TableStore(f"sqlite:///{blocker / 'profiler.db'}")
    with pytest.raises(UserError, match=r"the folder .*/file does not exist"):
        TableStore(f"sqlite:///{blocker / 'sub' / 'profiler.db'}")


def test_a_store_url_grows_no_tree_of_folders(tmp_path: Path) -> None:
    """Its own folder is made, as mkdir makes one; a path whose parents are missing is refused."""
    TableStore(f"sqlite:///{tmp_path / 'store' / 'profiler.db'}").close()
    assert (tmp_path / "store" / "profiler.db").is_file()
    with pytest.raises(UserError, match=r"the folder .*/nonexistent does not exist"):
        TableStore(f"sqlite:///{tmp_path / 'nonexistent' / 'dir' / 'x.db'}")
    assert not (tmp_path / "nonexistent").exists()


def test_unreachable_postgresql_is_retried_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on the port: the store starts, each publish raises StoreError."""
    url = "postgresql://profiler:hunter2@127.0.0.1:9/profiler?connect_timeout=2"
    with caplog.at_level(logging.WARNING):
        store = TableStore(url)
    assert "will retry" in caplog.text
    assert "hunter2" not in caplog.text
    with pytest.raises(StoreError, match="database unavailable") as caught:
        store.publish(cycle(T0, [profile("0")]))
    assert "hunter2" not in str(caught.value)
    store.close()


def test_a_store_from_a_newer_version_is_refused(store: TableStore, store_url: str) -> None:
    engine = engine_for(store_url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(UserError, match="has a schema this gpu-profiler does not know"):
        TableStore(store_url)


def test_postgres_fixture_skips_without_binaries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Imported here: at module level it would precede its registration as a pytest plugin.
    from tests.support import postgres as postgres_support  # noqa: PLC0415

    monkeypatch.setattr(postgres_support, "find_bin_dir", lambda: None)
    with (
        pytest.raises(pytest.skip.Exception, match="PostgreSQL is not installed"),
        postgres_support.running_postgres(),
    ):
        pass


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
